"""The node's status page: its JSON, Prometheus /metrics (parsed with prometheus_client's parser), /healthz and
HTML served by a real server on 127.0.0.1; a running node's page rendered by headless Chromium (skipped, with the
reason, where Debian's chromium is not installed)."""
# ruff: noqa: F811  (the started fixture imported from tests.node_fixtures is redefined as an argument)

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sapo.node.about import sapo_version
from sapo.node.board import BoardLogHandler, StatusBoard
from sapo.node.web import StatusServer, node_app
from swarm.memory import MemorySwarm
from tests.node_fixtures import _evaluations, _metrics, _node_command, _p2pd, _wait, start_node, started  # noqa: F401
from tests.swarm_fixtures import make_group

HOSTILE = '<script>alert("x")</script>'
# What SAPOTrainer logs per step besides the own reward: the swarm groups' reward (none taken at step 1), groups
# taken and filled in, the step's seconds and its phases' seconds.
STEP_FIGURES = {
    1: {"sapo/external_groups": 0.0, "sapo/fill_ins": 2.0, "step_time": 0.75, "sapo/time/generation": 0.5},
    2: {"sapo/external_reward": 0.875, "sapo/external_groups": 1.0, "sapo/fill_ins": 1.0, "step_time": 3.0,
        "sapo/time/generation": 2.0, "sapo/time/swarm_fetch": 0.02},
    3: {"sapo/external_reward": 0.625, "sapo/external_groups": 2.0, "sapo/fill_ins": 0.0, "step_time": 45.0,
        "sapo/time/generation": 30.0, "sapo/time/swarm_fetch": 0.03, "sapo/total/dropped/zero_advantage": 1.0},
}  # fmt: skip


def get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


@pytest.fixture
def board_and_server():
    swarm = MemorySwarm()
    me, other = swarm.join("me", "tiny"), swarm.join("peer-b", HOSTILE)
    other.publish([make_group("g1"), make_group("g2")])
    assert len(me.fetch(2)) == 2  # the transport's own counters (fetched_groups) are on the page and in /metrics
    board = StatusBoard("test-node", max_steps=10, version="9.8.7", model="tiny-llama")
    board.set_phase("training", 3)
    for step, reward in [(1, 0.25), (2, 0.5), (3, 0.75)]:
        board.record_step(step, {"sapo/local_reward": reward, **STEP_FIGURES[step]})
    board.record_held_out(0, 0.125, 0.05, {"basic_arithmetic": 0.25, "chain_sum": 0.0})
    board.record_held_out(3, 0.375, 0.06, {"basic_arithmetic": 0.5, "chain_sum": 0.25})
    board.record_swarm(me, rejoin_through=[])
    board.record_senders({"peer-b": Counter({"taken": 5, "dropped/hygiene": 2, "dropped/plausibility": 1})})
    server = StatusServer(node_app(board.snapshot), "127.0.0.1", 0)
    try:
        yield board, server
    finally:
        server.close()
        me.close()
        other.close()


def test_status_json_holds_what_the_node_recorded(board_and_server):
    board, server = board_and_server
    code, kind, body = get(server.url + "status.json")
    assert code == 200 and kind == "application/json"
    snap = json.loads(body)
    assert snap["phase"] == "training" and snap["step"] == 3 and snap["max_steps"] == 10
    assert snap["reward"] == [[1, 0.25], [2, 0.5], [3, 0.75]]
    assert snap["swarm_reward"] == [[2, 0.875], [3, 0.625]]
    assert snap["taken"] == [[1, 0.0], [2, 1.0], [3, 2.0]] and snap["fill_ins"] == [[1, 2.0], [2, 1.0], [3, 0.0]]
    assert snap["held_out"] == [[0, 0.125, 0.05], [3, 0.375, 0.06]]
    assert snap["held_out_tasks"] == {"basic_arithmetic": [[0, 0.25], [3, 0.5]], "chain_sum": [[0, 0.0], [3, 0.25]]}
    assert (snap["version"], snap["model"]) == ("9.8.7", "tiny-llama")
    assert snap["senders"]["peer-b"] == {"taken": 5, "dropped/hygiene": 2, "dropped/plausibility": 1}
    assert snap["health"]["status"] == "ok"
    assert snap["swarm"]["state"] == "joined" and [p["peer"] for p in snap["swarm"]["peers"]] == ["peer-b"]


def test_metrics_are_prometheus_text_with_the_nodes_figures(board_and_server):
    _, server = board_and_server
    code, kind, body = get(server.url + "metrics")
    assert code == 200 and kind.startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    assert samples[("sapo_step", ())] == 3
    assert samples[("sapo_training_reward", ())] == 0.75
    assert samples[("sapo_held_out_pass_at_1", ())] == 0.375
    assert samples[("sapo_groups_taken_total", (("sender", "peer-b"),))] == 5
    assert samples[("sapo_groups_dropped_total", (("reason", "hygiene"), ("sender", "peer-b")))] == 2
    assert samples[("sapo_phase", (("phase", "training"),))] == 1
    assert samples[("sapo_health", (("status", "ok"),))] == 1
    assert samples[("sapo_build_info", (("model", "tiny-llama"), ("version", "9.8.7")))] == 1
    assert samples[("sapo_swarm_groups_reward", ())] == 0.625
    assert samples[("sapo_step_swarm_groups", ())] == 2 and samples[("sapo_step_fill_ins", ())] == 0
    assert samples[("sapo_held_out_task_pass_at_1", (("task", "chain_sum"),))] == 0.25
    # Step durations 0.75, 3 and 45 s in the histogram's cumulative buckets; phases by label.
    step_buckets = {dict(labels)["le"]: v for (name, labels), v in samples.items()
                    if name == "sapo_step_duration_seconds_bucket"}  # fmt: skip
    assert (step_buckets["0.5"], step_buckets["1.0"], step_buckets["5.0"], step_buckets["60.0"]) == (0, 1, 2, 3)
    assert step_buckets["+Inf"] == samples[("sapo_step_duration_seconds_count", ())] == 3
    assert samples[("sapo_step_duration_seconds_sum", ())] == 48.75
    assert samples[("sapo_phase_duration_seconds_count", (("phase", "generation"),))] == 3
    assert samples[("sapo_phase_duration_seconds_sum", (("phase", "swarm_fetch"),))] == 0.05
    assert samples[("sapo_phase_duration_seconds_bucket", (("le", "0.05"), ("phase", "swarm_fetch")))] == 2
    assert samples[("process_resident_memory_bytes", ())] > 0  # the process collector is registered


def test_page_shows_the_figures_escapes_peer_text_and_healthz_follows_health(board_and_server):
    board, server = board_and_server
    code, kind, page = get(server.url)
    assert code == 200 and kind.startswith("text/html")
    assert 'data-series="reward" data-step="3" data-value="0.750"' in page  # the own reward point of step 3
    assert 'data-series="swarm groups" data-step="2" data-value="0.875"' in page  # the swarm groups' reward
    assert 'data-series="taken" data-step="3" data-value="2.000"' in page
    assert 'data-series="filled in" data-step="1" data-value="2.000"' in page
    assert 'data-series="held-out pass@1" data-step="3" data-value="0.375"' in page
    assert 'data-series="chain_sum" data-step="3" data-value="0.250"' in page  # pass@1 per task
    assert 'id="version">9.8.7<' in page and 'id="model">tiny-llama<' in page
    assert "peer-b" in page and "hygiene 2" in page
    assert "<script" not in page and "&lt;script&gt;" in page  # a peer's model name is shown, escaped
    assert get(server.url + "healthz")[:1] == (200,)
    assert get(server.url + "nothing-here")[0] == 404

    # an error logged by the node shows up as its last error
    import logging

    handler = BoardLogHandler(board)
    log = logging.getLogger("sapo.test_status_page")
    log.addHandler(handler)
    try:
        log.error("p2pd died with code %d", 9)
    finally:
        log.removeHandler(handler)
    assert "p2pd died with code 9" in get(server.url)[2]
    assert json.loads(get(server.url + "status.json")[2])["last_error"]["message"] == "p2pd died with code 9"


# PromQL words that are not series names; labels every scraped series gets from Prometheus; the bucket label.
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                 "offset", "inf", "nan"}  # fmt: skip
_TARGET_LABELS = {"instance", "job"}


def _queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of a Grafana dashboard: its panels' targets and its query variables."""
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            exprs.append(re.sub(r"^label_values\((\w+), *(\w+)\)$", r"\1{\2=~\".+\"}", query))
    return exprs


def _series_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """The series names an expression reads, and the label names it matches or groups by."""
    labels = set(re.findall(r"\b(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))
    for grouping in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {label.strip() for label in grouping.split(",") if label.strip()}
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    words = {m.group(0) for m in re.finditer(r"[A-Za-z_:][\w:]*", bare) if not bare[m.end() :].lstrip().startswith("(")}
    return {w for w in words if w.lower() not in _PROMQL_WORDS}, labels


def test_the_grafana_dashboard_queries_only_series_and_labels_the_node_exports(board_and_server):
    """Every query of docs/grafana_dashboard.json names series (and labels) that a node's /metrics serves, and the
    dashboard shows what an operator asks: build info, rewards, pass@1 per task, groups per step, durations."""
    _, server = board_and_server
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(get(server.url + "metrics")[2]):
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    dashboard = json.loads((Path(__file__).resolve().parents[1] / "docs" / "grafana_dashboard.json").read_text())
    read = set()
    for expr in _queries(dashboard):
        series, labels = _series_and_labels(expr)
        assert series, f"no series in {expr!r}"
        unknown = series - set(exported)
        assert not unknown, f"{expr!r} reads {unknown}, which /metrics does not export"
        allowed = set().union(*(exported[name] for name in series)) | _TARGET_LABELS
        assert labels <= allowed, f"{expr!r} uses labels {labels - allowed} that {series} do not carry"
        read |= series
    assert {"sapo_build_info", "sapo_training_reward", "sapo_swarm_groups_reward", "sapo_held_out_task_pass_at_1",
            "sapo_step_swarm_groups", "sapo_step_fill_ins", "sapo_step_duration_seconds_bucket",
            "sapo_phase_duration_seconds_sum", "sapo_health", "sapo_last_step_timestamp_seconds"} <= read  # fmt: skip
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in dashboard["panels"])


def test_a_taken_port_falls_back_to_a_free_one_unless_told_not_to():
    board = StatusBoard()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = StatusServer(node_app(board.snapshot), "127.0.0.1", port)
        try:
            assert server.port != port and get(server.url + "healthz")[0] == 200
        finally:
            server.close()
        with pytest.raises(OSError):
            StatusServer(node_app(board.snapshot), "127.0.0.1", port, fallback=False)


def test_idle_connections_take_a_bounded_number_of_slots_and_a_silent_one_is_closed(monkeypatch):
    """Each connection holds a thread and a file descriptor: about 1,000 idle ones used to exhaust the node's open
    files (systemd's default limit) and stop it. Beyond `MAX_CONNECTIONS` a connection is closed at once, a silent
    one after `REQUEST_TIMEOUT_SECONDS`, and the page answers again once the idle ones are gone."""
    from sapo.node import web

    monkeypatch.setattr(web, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(web._QuietHandler, "timeout", 1.0)
    server = StatusServer(node_app(StatusBoard().snapshot), "127.0.0.1", 0)
    served = server._server  # the socketserver: its counts of connections
    idle = []
    try:
        for _ in range(4):
            idle.append(socket.create_connection(("127.0.0.1", server.port)))
            idle[-1].sendall(b"GET / HT")  # a request begun, never finished
        _wait(lambda: served.open_connections == 4, 10, "the four idle connections to be served")
        with socket.create_connection(("127.0.0.1", server.port)) as extra:
            extra.settimeout(10)
            extra.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert extra.recv(100) == b""  # closed unanswered: every slot is taken
        assert served.connections_refused == 1
        for sock in idle:  # each closed by the server once silent for the timeout, unanswered
            sock.settimeout(10)
            assert sock.recv(100) == b""
        _wait(lambda: served.open_connections == 0, 10, "the silent connections to be let go")
        assert get(server.url + "healthz")[0] == 200
    finally:
        for sock in idle:
            sock.close()
        server.close()


def test_a_client_asking_as_fast_as_it_can_gets_a_bounded_rate_and_one_rendering_per_change(monkeypatch):
    """A client asking the page over and over cost the node most of a core (rendering a long run's page takes about
    11 ms, and each connection a thread and HTTP parsing): now a route renders once per change of the board and once a
    second, and connections beyond a burst of `MAX_CONNECTIONS` are accepted at `CONNECTIONS_PER_SECOND`. What the
    node records is on the page at the next request all the same."""
    import time

    from sapo.node import web

    renders = []
    render = web.node_page
    monkeypatch.setattr(web, "node_page", lambda snap: renders.append(snap["step"]) or render(snap))
    board = StatusBoard("test-node", max_steps=10)
    board.record_step(1, {"sapo/local_reward": 0.25})
    server = StatusServer(node_app(board.snapshot), "127.0.0.1", 0)
    try:
        answered, began = 0, time.monotonic()
        while time.monotonic() - began < 2.0:
            code, _, page = get(server.url)
            answered += code == 200 and 'data-series="reward" data-step="1"' in page
        seconds = time.monotonic() - began
        assert 1 <= answered <= web.MAX_CONNECTIONS + web.CONNECTIONS_PER_SECOND * seconds + 1
        assert 1 <= len(renders) <= seconds + 2  # once, then at most once a second: nothing was recorded meanwhile
        board.record_step(2, {"sapo/local_reward": 0.5})
        assert 'data-series="reward" data-step="2" data-value="0.500"' in get(server.url)[2]
        assert renders[-1] == 2
    finally:
        server.close()


def test_a_node_stuck_before_its_first_step_is_unhealthy_unless_its_phase_asked_for_longer():
    from sapo.node.board import FIRST_STEP_SECONDS

    now = [1_800_000_000.0]
    board = StatusBoard(clock=lambda: now[0])
    board.set_phase("loading model", 0)
    now[0] += FIRST_STEP_SECONDS - 1
    assert board.snapshot()["health"]["status"] == "ok"
    now[0] += 2
    health = board.snapshot()["health"]
    assert health["status"] == "unhealthy" and health["problems"] == [
        f"stalled: 'loading model' for {FIRST_STEP_SECONDS + 1:.0f} s before the first step "
        f"(limit {FIRST_STEP_SECONDS:.0f} s)"
    ]
    board.set_phase("waiting for 2 peer(s)", 0, patience=2 * FIRST_STEP_SECONDS)  # a new phase: its own time
    now[0] += 1.5 * FIRST_STEP_SECONDS
    assert board.snapshot()["health"]["status"] == "ok"
    now[0] += FIRST_STEP_SECONDS
    assert board.snapshot()["health"]["status"] == "unhealthy"
    board.record_step(1, {"reward": 0.5})  # from the first step on, the step-based limit applies
    assert board.snapshot()["health"]["status"] == "ok"


def test_a_paced_node_is_called_stalled_only_after_ten_paced_steps_without_a_step():
    from sapo.node.board import STALL_MIN_SECONDS, STALL_STEPS

    now = [1_800_000_000.0]
    paced, unpaced = (StatusBoard(min_step_seconds=pace, clock=lambda: now[0]) for pace in (3600.0, 0.0))
    for board in (paced, unpaced):
        board.record_step(1, {"reward": 0.5})  # one step's end: no median step time yet
    now[0] += STALL_MIN_SECONDS + 60  # a paced node still resting out its hour
    assert paced.snapshot()["health"]["status"] == "ok" and unpaced.snapshot()["health"]["status"] == "unhealthy"
    now[0] += STALL_STEPS * 3600.0
    health = paced.snapshot()["health"]
    assert health["status"] == "unhealthy" and f"(limit {STALL_STEPS * 3600.0:.0f} s)" in health["problems"][-1]


def test_a_resumed_node_plots_the_steps_logged_before_its_restart(tmp_path):
    from sapo.node.callbacks import MetricsJsonl, NodeStatus

    lines = [
        {"step": 0, "eval/pass@1": 0.25, "eval/pass@1_se": 0.1, "eval/questions": 8, "eval/pass@1/chain_sum": 0.5},
        {"step": 1, "sapo/local_reward": 0.5, "sapo/external_reward": 0.75, "sapo/external_groups": 1.0},
        {"step": 2, "sapo/local_reward": 0.25, "sapo/fill_ins": 1.0},
        {"step": 3, "sapo/local_reward": 0.125},  # past the checkpoint the node resumes from: dropped
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    board = StatusBoard()
    NodeStatus(tmp_path, board).replay(MetricsJsonl(path, resume_step=2).history)
    snap = board.snapshot()
    assert snap["reward"] == [[1, 0.5], [2, 0.25]] and snap["swarm_reward"] == [[1, 0.75]]
    assert snap["taken"] == [[1, 1.0]] and snap["fill_ins"] == [[2, 1.0]]
    assert snap["held_out"] == [[0, 0.25, 0.1]] and snap["held_out_tasks"] == {"chain_sum": [[0, 0.5]]}
    assert snap["last_step_time"] is None  # history is plotted, not counted as steps of this process


def test_series_stay_bounded_over_a_long_run():
    board = StatusBoard()
    for step in range(1, 20001):
        board.record_step(step, {"reward": step % 7 / 7})
    points = board.snapshot()["reward"]
    assert len(points) <= 2000 and points[-1][0] == 20000 and points[0][0] == 1


# ----------------------------------------------------------------------------------------------------
# a running node, its page in a real browser


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("headless browser check needs Debian's chromium: apt-get install -y chromium")
    return path


def browse(browser: str, url: str, tmp_path: Path, *, screenshot: Path | None = None) -> str:
    """The DOM Chromium renders for ``url`` (or a screenshot of it), headless and offline."""
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1100,1400",
    ]  # fmt: skip
    action = [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    result = subprocess.run([browser, *flags, *action, url], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_the_page_draws_own_against_swarm_reward_groups_per_step_and_pass_at_1_per_task_in_chromium(
    board_and_server, tmp_path
):
    browser = chromium()
    _, server = board_and_server
    dom = browse(browser, server.url, tmp_path)
    charts = re.findall(r'<svg class="chart" data-chart="(\w+)"', dom)
    assert charts == ["reward", "slots", "held_out", "held_out_tasks"]
    for chart, series in (("reward", ["reward", "swarm groups"]), ("slots", ["taken", "filled in"]),
                          ("held_out_tasks", ["basic_arithmetic", "chain_sum"])):  # fmt: skip
        svg = re.search(rf'data-chart="{chart}".*?</svg>', dom, flags=re.S).group(0)
        assert re.findall(r'<polyline data-series="([^"]+)"', svg) == series, chart
    assert 'data-series="swarm groups" data-step="3" data-value="0.625"' in dom


def test_a_running_nodes_page_renders_its_logged_figures_in_chromium(tmp_path, tiny_model_a, started):
    browser = chromium()
    out = tmp_path / "node"
    node = start_node(
        _node_command(tiny_model_a, out, "--max_steps", "1000", "--save_steps", "1000", "--eval_steps", "2",
                      "--eval_questions", "8", "--status_port", "0"),
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "node.log", "w"),
    )  # fmt: skip
    started.append(node)
    _wait(lambda: len(_metrics(out)) >= 3 and len(_evaluations(out)) >= 2, 300, "three steps, two evaluations", node)
    url = json.loads((out / "status.json").read_text())["page"]
    assert url.startswith("http://127.0.0.1:")

    dom = browse(browser, url, tmp_path)
    snap = json.loads(get(url + "status.json")[2])
    # What the node logged in metrics.jsonl is what the browser shows: every held-out evaluation, and the rewards.
    logged = {m["step"]: m for m in _metrics(out)}
    shown_reward = dict(re.findall(r'data-series="reward" data-step="(\d+)" data-value="([\d.]+)"', dom))
    assert shown_reward, "no reward point in the rendered page"
    for step, value in shown_reward.items():
        assert abs(logged[int(step)]["sapo/local_reward"] - float(value)) < 1e-3
    shown_held_out = dict(re.findall(r'data-series="held-out pass@1" data-step="(\d+)" data-value="([\d.]+)"', dom))
    assert {int(s) for s in shown_held_out} >= {e["step"] for e in _evaluations(out)[:2]}
    for evaluation in _evaluations(out)[:2]:
        assert abs(evaluation["eval/pass@1"] - float(shown_held_out[str(evaluation["step"])])) < 1e-3
    for series, key in (("taken", "sapo/external_groups"), ("filled in", "sapo/fill_ins")):  # groups per step
        shown = dict(re.findall(rf'data-series="{series}" data-step="(\d+)" data-value="([\d.]+)"', dom))
        assert shown and all(abs(logged[int(step)][key] - float(value)) < 1e-3 for step, value in shown.items())
    shown_task = dict(re.findall(r'data-series="basic_arithmetic" data-step="(\d+)" data-value="([\d.]+)"', dom))
    for evaluation in _evaluations(out)[:2]:  # held-out pass@1 per task
        assert abs(evaluation["eval/pass@1/basic_arithmetic"] - float(shown_task[str(evaluation["step"])])) < 1e-3
    join = snap["swarm"]["addresses"][0]
    assert f"sapo-node --initial_peers {join}" in dom  # the join address
    # One peer id, the one in the join address; the signing key's fingerprint labelled as such.
    assert re.search(r'id="peer-id">([^<]+)<', dom).group(1) == join.rsplit("/p2p/", 1)[1] == snap["swarm"]["peer_id"]
    assert re.search(r'id="key-fingerprint">([0-9a-f]{16})<', dom).group(1) == snap["swarm"]["key_fingerprint"]
    assert re.search(r'id="version">([^<]+)<', dom).group(1) == sapo_version()
    assert re.search(r'id="model">([^<]+)<', dom).group(1) == str(tiny_model_a)
    assert re.search(r'id="phase">[^<]+<', dom) and 'id="health"' in dom

    shot = tmp_path / "node_status_page.png"
    browse(browser, url, tmp_path, screenshot=shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000

    p2pd = _p2pd(out)
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=300) == 0
    from tests.node_fixtures import _assert_gone

    _assert_gone(p2pd)
    with pytest.raises(OSError):
        get(url)  # the page left with the node


def test_the_page_counts_every_drop_by_reason_and_reads_from_the_first_evaluation_in_chromium(tmp_path):
    """Right after a node's first evaluation and step: zero-advantage groups (which no sender is charged with) are
    counted on the page and in /metrics, sapo_step counts completed steps (not the one in progress), the lone
    held-out evaluation sits at step 0 of the run's axis, per-task points of equal value are told apart, and the
    figures are in a table too."""
    browser = chromium()
    board = StatusBoard("test-node", max_steps=20, version="9.8.7", model="tiny-llama")
    board.record_held_out(0, 0.0, 0.0, {"basic_arithmetic": 0.0, "chain_sum": 0.0, "leg_counting": 0.0})
    board.record_step(1, {"sapo/local_reward": 0.25, "sapo/total/dropped/zero_advantage": 3.0})
    board.set_phase("generating", 2)  # step 2 in progress
    server = StatusServer(node_app(board.snapshot), "127.0.0.1", 0)
    try:
        _, _, body = get(server.url + "metrics")
        dom = browse(browser, server.url, tmp_path)
    finally:
        server.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    assert samples[("sapo_step", ())] == 1
    assert samples[("sapo_groups_dropped_by_reason_total", (("reason", "zero_advantage"),))] == 3
    assert re.search(r"<td><code>zero_advantage</code></td><td>3</td>", dom)
    per_task = re.search(r'data-chart="held_out_tasks".*?</svg>', dom, flags=re.S).group(0)
    xs = re.findall(r'<circle data-series="[^"]+" data-step="0" data-value="0.000" cx="([\d.]+)"', per_task)
    assert len(xs) == 3 and len(set(xs)) == 3  # three tasks at 0: three points side by side
    overall = re.search(r'data-chart="held_out".*?</svg>', dom, flags=re.S).group(0)
    assert re.search(r">20</text>", overall)  # the axis spans the run, not a made-up step 0-1
    table = re.search(r'<div id="held-out-table">.*?</div>', dom, flags=re.S).group(0)
    assert "step 0" in table and "leg_counting" in table


def test_health_of_an_output_dir_is_its_own_node_s_not_another_s_that_took_its_port(board_and_server, tmp_path, capsys):
    """A node that left frees its page's port; another node on the machine may take it (one whose own port was taken
    moves to a free one). `sapo-node health --output-dir` asked the recorded page and reported the other node's health
    as the left node's. The page names its node process (`X-Sapo-Instance`), status.json records it, and they must
    agree; asked by `--url` alone, any node answering counts."""
    from sapo.node import health
    from sapo.node.status import write_status

    board, server = board_and_server
    other = StatusServer(node_app(board.snapshot, instance="the-node-now-there"), "127.0.0.1", 0)
    try:
        write_status(tmp_path, "training", 3, page=other.url, instance="the-node-that-left")
        assert health.main(["--output-dir", str(tmp_path)]) == 1
        assert "another node process's" in capsys.readouterr().out
        write_status(tmp_path, "training", 3, page=other.url, instance="the-node-now-there")
        assert health.main(["--output-dir", str(tmp_path)]) == 0 and capsys.readouterr().out.startswith("ok")
        assert health.main(["--url", other.url]) == 0
    finally:
        other.close()
