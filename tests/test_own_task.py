"""A researcher's own task in a swarm, end to end: two sapo-node processes on loopback, each holding the same JSON Lines
questions in its own order (one an 80 % split), each scoring with a reward from its own module that reads an extra
column, take each other's groups, never drop one as a mismatch, bench nobody, and evaluate held-out pass@1 on the
user's task."""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
from pathlib import Path

from sapo.group_log import read_group_log
from sapo.node.cli import main
from tests.node_fixtures import TINY, _assert_gone, _evaluations, _metrics, _p2pd, _wait, run_node, start_node

REWARD_MODULE = '''
def units_reward(prompts, completions, answer, units, **kwargs):
    """1.0 when the completion names the answer and the unit the item's `units` column holds."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(a in t) + 0.5 * float(u in t) for t, a, u in zip(texts, answer, units)]
'''


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_two_nodes_share_a_users_dataset_in_different_orders_and_a_split(tmp_path, tiny_model_a):
    records = [{"question": f"How many metres are {k} km?", "answer": str(1000 * k), "units": "m"} for k in range(60)]
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    full = _write_jsonl(tmp_path / "km-full.jsonl", list(reversed(records)))
    split = _write_jsonl(tmp_path / "km-split.jsonl", shuffled[: int(0.8 * len(shuffled))])
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    configs = []
    for name, path in (("full", full), ("split", split)):
        config = tmp_path / f"{name}.yaml"
        config.write_text(f"dataset: {path}\ndataset_name: km\neval_fraction: 0.2\neval_questions: 6\n")
        configs += ["--node-config", str(config)]
    run_dir = tmp_path / "run"
    tiny = [a for a in TINY if a not in ("--tasks", "basic_arithmetic")]  # the dataset replaces the tasks
    result = run_node(
        [sys.executable, "-m", "sapo.node.cli", "local-swarm", "--peers", "2", "--run-dir", str(run_dir),
         "--status-interval", "5", *configs, "--model", str(tiny_model_a), *tiny,
         "--rewards", f"{tmp_path / 'my_rewards.py'}:units_reward", "--max_steps", "10", "--save_steps", "10",
         "--eval_steps", "10", "--min_step_seconds", "1"],  # evaluated at the start and the end only; groups are
        # polled once a second: 10 steps paced to 1 s meet the other node's groups as 30 unpaced tiny steps did
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for i in range(2):
        node = run_dir / f"node-{i}"
        rows = _metrics(node)
        assert rows[-1]["step"] == 10 and rows[-1].get("sapo/total/external_groups", 0) > 0, _why_none(run_dir, i)
        assert "rewards/units_reward/mean" in rows[-1]  # the user's module was loaded and called by TRL
        groups = [g for g in read_group_log(node / "groups.jsonl") if g["origin"] == "swarm"]
        outcomes = {g["outcome"] for g in groups}
        assert "taken" in outcomes and not outcomes & {"question_mismatch", "unknown_source", "version_skew"}
        senders = json.loads((node / "senders.json").read_text())
        assert rows[-1].get("sapo/total/benched_senders", 0) == 0 and all("taken" in c for c in senders.values())
        evaluations = _evaluations(node)
        assert evaluations and all(e["eval/questions"] >= 1 and "eval/pass@1/km" in e for e in evaluations)
    # The 80 % split holds every item the full copy draws from it, the full copy only some the split lacks: what
    # the split's node cannot verify is an item it does not hold, never a mismatch.
    split_node = [g for g in read_group_log(run_dir / "node-1" / "groups.jsonl") if g["origin"] == "swarm"]
    assert {g["outcome"] for g in split_node} <= {"taken", "item_not_held", "not_chosen", "zero_advantage", "stale",
                                                  "implausible", "peer_cap"}  # fmt: skip


def _why_none(run_dir: Path, i: int) -> str:
    """What a node that took no swarm group saw: the outcomes of the swarm groups it logged, each node's steps (their
    time since the first step of either, and the peers each estimated) and its log (what it heard, and from whom)."""
    swarm_groups = [g for g in read_group_log(run_dir / f"node-{i}" / "groups.jsonl") if g["origin"] == "swarm"]
    outcomes = collections.Counter(g["outcome"] for g in swarm_groups)
    rows = {n: _metrics(run_dir / f"node-{n}") for n in range(2)}
    start = min(row["time"] for n in rows for row in rows[n])
    steps = {f"node-{n}": [(row["step"], round(row["time"] - start, 1), row.get("swarm/gauge/estimated_peers"))
                           for row in rows[n]] for n in rows}  # fmt: skip
    log = (run_dir / f"node-{i}" / "node.log").read_text().splitlines()[-40:]
    return (f"node-{i} took none; its swarm groups' outcomes {dict(outcomes)}; (step, seconds, peers) {steps}; "
            "its node.log's last lines:\n" + "\n".join(log))  # fmt: skip


FLAKY_REWARD = '''
def picky_reward(prompts, completions, answer, **kwargs):
    """Chokes on answers that end in 0 (a fifth of the items), like a parser meeting a format it never saw."""
    if any(a.endswith("0") for a in answer):
        raise ValueError("cannot parse " + ", ".join(answer))
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(a in t) for t, a in zip(texts, answer)]


def broken_reward(prompts, completions, **kwargs):
    raise KeyError("unit")
'''


def _alone(tmp_path: Path, model: Path, name: str, reward: str, *extra: str) -> tuple[list[str], Path]:
    records = [{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(1, 41)]  # 8 of 40 end in 0
    data = _write_jsonl(tmp_path / "doubling.jsonl", records)
    (tmp_path / "flaky_rewards.py").write_text(FLAKY_REWARD)
    out = tmp_path / name
    tiny = [a for a in TINY if a not in ("--tasks", "basic_arithmetic")]
    command = [sys.executable, "-m", "sapo.node.cli", "--model", str(model), "--output_dir", str(out), *tiny,
               "--dataset", str(data), "--rewards", f"{tmp_path / 'flaky_rewards.py'}:{reward}", "--eval_strategy",
               "no", "--eval_on_start", "false", "--status_port", "0", *extra]  # fmt: skip
    return command, out


def test_a_reward_raising_on_a_fifth_of_own_rows_is_counted_and_the_node_goes_on(tmp_path, tiny_model_a):
    import signal
    import urllib.request

    command, out = _alone(tmp_path, tiny_model_a, "flaky", "picky_reward", "--max_steps", "1000")
    node = start_node(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        log = out / "node.log"
        _wait(lambda: log.exists() and "raised on" in log.read_text(), 300, "a reward error in node.log", node)
        steps = len(_metrics(out))
        _wait(lambda: len(_metrics(out)) >= steps + 3, 300, "three more steps", node)  # it goes on
        line = next(x for x in log.read_text().splitlines() if "raised on" in x)
        assert "reward picky_reward raised on doubling item " in line and "ValueError: cannot parse" in line
        url = json.loads((out / "status.json").read_text())["page"]
        with urllib.request.urlopen(url + "metrics", timeout=10) as response:
            exposition = response.read().decode()
        counted = float(next(x for x in exposition.splitlines() if x.startswith('sapo_errors_total{kind="reward"}'))
                        .split()[-1])  # fmt: skip
        assert counted > 0 and counted % 2 == 0  # every completion of a failing question (2 per group), nothing else
        with urllib.request.urlopen(url, timeout=10) as response:
            assert 'id="reward-errors">' in response.read().decode()
        assert _metrics(out)[-1]["sapo/total/reward_errors"] > 0
        assert node.poll() is None
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=120) == 0
    finally:
        if node.poll() is None:
            node.kill()
            node.wait(timeout=30)
    _assert_gone(_p2pd(out))


def test_a_reward_failing_on_every_row_stops_the_node_saying_why(tmp_path, tiny_model_a, capsys):
    command, out = _alone(tmp_path, tiny_model_a, "broken", "broken_reward", "--max_steps", "20",
                          "--max_reward_errors_in_a_row", "4")  # fmt: skip
    code = main(command[3:])  # in this process, as `sapo-node` runs it (the test is about the node, not the process)
    err = capsys.readouterr().err
    assert code == 4, err[-3000:]
    reason = "stopping: reward broken_reward failed on 4 own rows in a row (limit 4)"
    assert reason in err.strip().splitlines()[-1]  # the last line the operator sees
    assert reason in (out / "node.log").read_text()
    status = json.loads((out / "status.json").read_text())
    assert status["phase"] == "stopped: reward errors" and "KeyError: 'unit'" in status["stopped"]


def test_a_reward_column_the_data_lacks_is_refused_at_start_with_the_columns_present(tmp_path, tiny_model_a, capsys):
    data = _write_jsonl(tmp_path / "km.jsonl", [{"question": f"{k} km in m?", "answer": str(1000 * k), "unit": "m"}
                                                for k in range(20)])  # fmt: skip
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)  # reads `units`; the data has `unit`
    base = ["--model", str(tiny_model_a), "--dataset", str(data),
            "--rewards", f"{tmp_path / 'my_rewards.py'}:units_reward", "--status_port", "none"]  # fmt: skip
    for extra, expected in (
        (["--reward_columns", "units", "--output_dir", str(tmp_path / "a")],
         "reward column(s) units not in the data; columns present: answer, question, unit"),
        (["--output_dir", str(tmp_path / "b")],
         "reward units_reward reads column(s) units that the training rows lack; columns present: answer, entry, "
         "prompt, provenance, task, unit"),
    ):  # fmt: skip
        code = main([*base, *extra])  # in this process, as `sapo-node` runs it: refused before any model loads
        err = capsys.readouterr().err
        assert code == 2, err[-2000:]
        assert expected in err.strip().splitlines()[-1]


def test_a_resume_with_another_split_or_other_data_is_refused(tmp_path, tiny_model_a, capsys):
    records = [{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(1, 41)]
    data = _write_jsonl(tmp_path / "doubling.jsonl", records)
    out = tmp_path / "run"
    tiny = [a for a in TINY if a not in ("--tasks", "basic_arithmetic")]
    base = ["--model", str(tiny_model_a), "--output_dir", str(out), *tiny, "--dataset", str(data), "--rewards",
            "math", "--eval_strategy", "no", "--eval_on_start", "false", "--status_port", "none", "--max_steps", "1",
            "--save_steps", "1"]  # fmt: skip
    # Each run in this process, as `sapo-node` runs it (the refusals come before any model loads).
    assert main(base) == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    _assert_gone(_p2pd(out))
    recorded = json.loads((out / "node-run.json").read_text())["data"]
    assert recorded["split"]["eval_fraction"] == 0.1 and "answer" in recorded["columns"] and recorded["fingerprint"]
    assert main([*base, "--eval_fraction", "0.3"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert "was trained on other data (fingerprint, split differ from node-run.json)" in last
    _write_jsonl(data, records[:30])
    assert main(base) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert "fingerprint" in last and "--allow_data_change" in last


SOURCE_MODULE = """
from sapo.sources import GeneratorSource


class Add(GeneratorSource):
    name, version = "add", "1"

    def generate(self, rng):
        a, b = rng.randint(1, self.config["top"]), rng.randint(1, self.config["top"])
        return {"question": f"What is {a} + {b}?", "answer": str(a + b)}
"""


def test_a_users_source_class_runs_from_the_command_line_with_its_arguments_from_yaml(tmp_path, tiny_model_a, capsys):
    (tmp_path / "my_source.py").write_text(SOURCE_MODULE)
    config = tmp_path / "node.yaml"
    config.write_text(f"source: {tmp_path / 'my_source.py'}:Add\nsource_args:\n  config:\n    top: 9\n")
    out = tmp_path / "run"
    tiny = [a for a in TINY if a not in ("--tasks", "basic_arithmetic")]
    code = main(  # in this process, as `sapo-node` runs it
        ["--config", str(config), "--model", str(tiny_model_a), "--output_dir", str(out), *tiny, "--rewards", "math",
         "--max_steps", "2", "--save_steps", "2", "--eval_steps", "100", "--eval_questions", "4", "--status_port",
         "none"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    _assert_gone(_p2pd(out))
    assert _metrics(out)[-1]["step"] == 2 and "eval/pass@1" in _evaluations(out)[0]
    assert json.loads((out / "node-run.json").read_text())["data"]["sources"] == ["add 1"]
    code = main(["--source", f"{tmp_path / 'my_source.py'}:Sub", "--output_dir", str(tmp_path / "bad"),
                 "--status_port", "none"])  # fmt: skip
    assert code == 2 and "has no sapo.sources.TaskSource subclass 'Sub'" in capsys.readouterr().err.splitlines()[-1]


def test_the_readmes_own_task_code_runs_as_printed(tmp_path, tiny_model_a, monkeypatch):
    import re

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("## Your own task") :]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    assert "load_policy()" in code  # the embedded model; the tiny one here, for time
    monkeypatch.chdir(Path(__file__).parent.parent)
    code = code.replace("load_policy()", f"load_policy({str(tiny_model_a)!r})").replace('"out"', repr(str(tmp_path)))
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    assert any("eval/pass@1" in entry for entry in trainer.state.log_history)


LIST_SOURCE = '''
from sapo.questions import GroupDropped, question_row
from sapo.sources import Rederived, TaskSource
from swarm.records import Provenance


class Halves(TaskSource):
    """Written from docs/extending.md's table: rows() and held_out() return lists of dicts."""

    name, version = "halves", "1"

    def _row(self, n):
        return question_row(f"What is half of {2 * n}?", str(n), Provenance(self.name, "halves", {}, 0, n, "1"))

    def rows(self, size=1000):
        return [self._row(n) for n in range(1, min(size, 40) + 1)]

    def held_out(self, size=None):
        return [self._row(n) for n in range(1000, 1000 + (size or 8))]

    def holds(self, provenance):
        return provenance.source == self.name

    def rederive(self, provenance, question):
        row = self._row(provenance.index)
        if row["prompt"][-1]["content"] != question:
            raise GroupDropped("question_mismatch", "another question")
        return Rederived(question, {k: v for k, v in row.items() if k != "prompt"})


class Broken(Halves):
    def held_out(self, size=None):
        return "not rows"
'''


def test_a_source_class_returning_lists_runs_and_one_returning_anything_else_is_refused_at_start(
    tmp_path, tiny_model_a, capsys
):
    (tmp_path / "halves.py").write_text(LIST_SOURCE)
    out = tmp_path / "run"
    tiny = [a for a in TINY if a not in ("--tasks", "basic_arithmetic")]
    base = ["--model", str(tiny_model_a), *tiny, "--rewards", "math", "--status_port", "none"]
    # in this process, as `sapo-node` runs it
    code = main([*base, "--source", f"{tmp_path / 'halves.py'}:Halves", "--output_dir", str(out), "--max_steps", "1",
                 "--eval_questions", "4"])  # fmt: skip
    err = capsys.readouterr().err
    try:
        assert code == 0, err[-3000:]
        assert _metrics(out)[-1]["step"] == 1
        assert [e["eval/questions"] for e in _evaluations(out)] == [4, 4]  # step 0 and the last step, of held_out()
        run = json.loads((out / "node-run.json").read_text())
        assert run["source"] == f"{tmp_path / 'halves.py'}:Halves" and "tasks" not in run  # what ran, recorded
    finally:
        _assert_gone(_p2pd(out))
    # Anything but a Dataset or a list of dicts: refused at start, one line, in node.log and status.json too.
    bad = tmp_path / "bad"
    code = main([*base, "--source", f"{tmp_path / 'halves.py'}:Broken", "--output_dir", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    expected = "held_out() returned a str; it must return a datasets.Dataset or a list of dicts (one per row)"
    assert code == 2 and expected in err[-1] and len(err) == 1, err
    assert expected in (bad / "node.log").read_text().splitlines()[-1]
    status = json.loads((bad / "status.json").read_text())
    assert status["phase"] == "stopped: error" and expected in status["stopped"]


def test_every_start_up_refusal_is_one_line_on_stderr_in_node_log_and_in_status_json(tmp_path, tiny_model_a, capsys):
    (tmp_path / "rewards_with_typo.py").write_text(
        "def exact(prompts, completions, **kw):\n    return [0.0 for _ in x]\n"
    )
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text(f"output_dir: {tmp_path / 'yaml'}\nmax_steps: 2\n  lora_r: [8\n")
    (tmp_path / "yaml").mkdir()  # the directory a refused command line names is written only where it exists
    cases = [
        (["--config", str(bad_yaml)], "yaml", "config file " + str(bad_yaml) + ": not valid YAML: mapping values are "
         "not allowed here at line 3, column 9"),
        (["--rewards", "no_such_module:exact"], "module", "reward 'no_such_module:exact': cannot import"),
        (["--rewards", f"{tmp_path / 'rewards_with_typo.py'}:exakt"], "function", "has no function 'exakt'"),
        (["--source", "no_such_module:Source"], "source", "--source 'no_such_module:Source': cannot import"),
        (["--max_steps", "two"], None, "argument --max_steps/--max-steps: invalid int value: 'two'"),
    ]  # fmt: skip
    for argv, folder, expected in cases:
        out = ["--output_dir", str(tmp_path / folder)] if folder and argv[0] != "--config" else []
        code = main(["--model", str(tiny_model_a), *argv, *out, "--status_port", "none"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and expected in err[0], (argv, err)
        if folder is None:
            continue
        assert expected in (tmp_path / folder / "node.log").read_text().splitlines()[-1]
        status = json.loads((tmp_path / folder / "status.json").read_text())
        assert status["phase"] == "stopped: error" and expected in status["stopped"], status
