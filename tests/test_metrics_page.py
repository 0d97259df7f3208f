"""docs/metrics.md lists every key SAPOTrainer can log and every series a node's /metrics serves, and nothing else: the
keys are read from the code that makes them (the round's figures, the intake's totals, the transport's counters and
gauges, the phases timed, the evaluation's figures), the series from the status server's collector."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "metrics.md"
HOLE = "<>"  # a placeholder: an f-string's {...}, the page's <reason>, <task>, ...
FAMILIES = {"sapo/time/<>": "phases", "sapo/total/<>": "totals", "swarm/<>": "counters", "swarm/gauge/<>": "gauges"}
"""The trainer's keys made from a name it reads at run time, and which names those are (see `_names_in`)."""


def _text(node: ast.AST) -> str | None:
    """A string constant, or an f-string with each placeholder as `<>`; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else HOLE for part in node.values)
    return None


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _names_in(tree: ast.Module, found: dict[str, set]) -> None:
    """Add to ``found`` what ``tree`` logs: `sapo/` and `swarm/` keys written out (`keys`), the names of the intake's
    totals (`x.totals[...]`), of the transport's counters (`x.counters.add(...)`, `.reject(reason)`), of its gauges
    (`gauges()`, `gauges={...}`) and of the phases timed (`timed(...)`). A name that is no literal is None."""
    in_f_strings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _name(node.value).endswith("totals"):
            found["totals"].add(_text(node.slice))
        elif (
            isinstance(node, ast.Call)
            and _name(node.func) in ("add", "reject")
            and isinstance(node.func, ast.Attribute)
        ):
            if _name(node.func.value).endswith("counters"):
                found["counters"].add(_text(node.args[0]) if node.func.attr == "add" else f"rejected/{HOLE}")
        elif isinstance(node, ast.Call) and _name(node.func) == "timed":
            found["phases"].add(_text(node.args[0]))
        elif isinstance(node, ast.FunctionDef) and node.name == "gauges":
            found["gauges"].update(_text(k) for d in ast.walk(node) if isinstance(d, ast.Dict) for k in d.keys if k)
        elif isinstance(node, ast.keyword) and node.arg == "gauges" and isinstance(node.value, ast.Dict):
            found["gauges"].update(_text(k) for k in node.value.keys if k is not None)
        key = _text(node) if id(node) not in in_f_strings else None
        if key is not None and key.startswith(("sapo/", "swarm/")):
            found["keys"].add(key)


def trainer_keys() -> set[str]:
    """Every key besides TRL's that SAPOTrainer can log, placeholders as `<>`, read from sapo/ and swarm/ (less the
    node application, which reads the keys; it makes none) and from the evaluation's figures."""
    found: dict[str, set] = {"keys": set(), "totals": set(), "counters": set(), "gauges": set(), "phases": set()}
    for path in [*(ROOT / "sapo").rglob("*.py"), *(ROOT / "swarm").rglob("*.py")]:
        if path.relative_to(ROOT).parts[:2] != ("sapo", "node"):
            _names_in(ast.parse(path.read_text()), found)
    unread = {kind: sorted(map(str, names)) for kind, names in found.items() if None in names}
    assert not unread, f"names this test cannot read (not a literal): {unread}"
    unknown = {key for key in found["keys"] if HOLE in key and key not in FAMILIES}
    assert not unknown, f"a new family of keys {unknown}: list its names in FAMILIES and on the page"
    keys = {key for key in found["keys"] if HOLE not in key}
    for family, kind in FAMILIES.items():
        if family in found["keys"]:
            keys |= {family.replace(HOLE, name) for name in found[kind]}
    from sapo.evaluation import HeldOutResult, QuestionResult

    evaluation = HeldOutResult([QuestionResult("TASK", 0, 1.0, "42", 3)]).metrics()
    return keys | {key.replace("TASK", HOLE) for key in evaluation}


def page_spans() -> list[str]:
    """The page's code spans, placeholders as `<>`."""
    return [re.sub(r"<[^>]*>", HOLE, span) for span in re.findall(r"`([^`\n]+)`", PAGE.read_text())]


def test_the_page_lists_every_key_the_trainer_can_log_and_no_other():
    logged = trainer_keys()
    listed = {span for span in page_spans() if span.startswith(("sapo/", "swarm/", "eval/")) and "..." not in span}
    assert logged - listed == set(), f"keys the trainer logs that docs/metrics.md does not list: {logged - listed}"
    assert listed - logged == set(), f"keys docs/metrics.md lists that the trainer does not log: {listed - logged}"
    each_kind = {"sapo/local_reward", "sapo/time/generation", "sapo/total/dropped/<>", "swarm/rejected/<>",
                 "swarm/<>_errors", "swarm/gauge/dht_neighbours", "eval/pass@1/<>"}  # fmt: skip
    assert each_kind <= logged  # the reading finds each kind of key


def served_series() -> set[str]:
    """The series names the node's collector (sapo/node/web.py) can serve, as Prometheus writes them (a counter with
    `_total`)."""
    tree = ast.parse((ROOT / "sapo" / "node" / "web.py").read_text())
    series = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and (name := _text(node.args[0])) and name.startswith("sapo_"):
            series.add(name + ("_total" if _name(node.func) == "CounterMetricFamily" else ""))
    return series


def test_the_page_lists_every_series_metrics_serves_and_no_other():
    from sapo.node.board import StatusBoard
    from sapo.node.web import SnapshotCollector
    from swarm.memory import MemorySwarm

    # A node's board with every figure recorded: what it serves is what the reading of web.py finds.
    me = MemorySwarm().join("me", "tiny")
    board = StatusBoard("node", max_steps=10, version="1.0", model="tiny")
    board.count_errors(lambda: {"reward": 1, "source": 0})
    for step in (1, 2, 3):
        board.record_step(step, {"sapo/local_reward": 0.5, "sapo/external_reward": 0.25, "sapo/external_groups": 1.0,
                                 "sapo/fill_ins": 1.0, "step_time": 2.0, "sapo/time/generation": 1.0,
                                 "sapo/total/dropped/stale": 1.0})  # fmt: skip
    board.record_held_out(1, 0.5, 0.1, {"chain_sum": 0.5})
    board.record_swarm(me, rejoin_through=[])
    board.record_senders({"peer-b": Counter({"taken": 1, "dropped/hygiene": 1})})
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(board.snapshot))
    served = {family.name + ("_total" if family.type == "counter" else "")
              for family in text_string_to_metric_families(generate_latest(registry).decode())}  # fmt: skip
    me.close()
    series = served_series()
    assert served == series, f"the reading of sapo/node/web.py and a scrape differ: {served ^ series}"
    listed = {re.sub(r"\{.*", "", span) for span in page_spans() if span.startswith("sapo_")}
    assert series - listed == set(), f"series /metrics serves that docs/metrics.md does not list: {series - listed}"
    assert listed - series == set(), f"series docs/metrics.md lists that /metrics does not serve: {listed - series}"


def test_the_readme_and_the_operations_page_link_the_metrics_page():
    for page in ("README.md", "docs/node_operations.md"):
        assert "metrics.md" in (ROOT / page).read_text(), f"{page} does not link docs/metrics.md"
