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

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from sapo.node.board import BoardLogHandler, StatusBoard  # noqa: E402
from sapo.node.web import StatusServer, node_app  # noqa: E402
from swarm.memory import MemorySwarm  # noqa: E402
from tests.node_fixtures import _evaluations, _metrics, _node_command, _p2pd_pid, _wait, started  # noqa: E402, F401

HOSTILE = '<script>alert("x")</script>'


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
    board = StatusBoard("test-node", max_steps=10)
    board.set_phase("training", 3)
    for step, reward in [(1, 0.25), (2, 0.5), (3, 0.75)]:
        board.record_step(step, {"sapo/local_reward": reward})
    board.record_held_out(0, 0.125, 0.05)
    board.record_held_out(3, 0.375, 0.06)
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
    assert snap["held_out"] == [[0, 0.125, 0.05], [3, 0.375, 0.06]]
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
    assert samples[("process_resident_memory_bytes", ())] > 0  # the process collector is registered


def test_page_shows_the_figures_escapes_peer_text_and_healthz_follows_health(board_and_server):
    board, server = board_and_server
    code, kind, page = get(server.url)
    assert code == 200 and kind.startswith("text/html")
    assert 'data-step="3" data-value="0.750"' in page  # the reward point of step 3
    assert 'data-step="3" data-value="0.375"' in page  # the held-out point of step 3
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


def test_a_running_nodes_page_renders_its_logged_figures_in_chromium(tmp_path, tiny_model_a, started):
    browser = chromium()
    out = tmp_path / "node"
    node = subprocess.Popen(
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
    assert f"sapo-node --initial_peers {snap['swarm']['addresses'][0]}" in dom  # the join address
    assert re.search(r'id="phase">[^<]+<', dom) and 'id="health"' in dom

    shot = tmp_path / "node_status_page.png"
    browse(browser, url, tmp_path, screenshot=shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000

    p2pd = _p2pd_pid(out)
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=300) == 0
    from tests.node_fixtures import _assert_gone

    _assert_gone(p2pd)
    with pytest.raises(OSError):
        get(url)  # the page left with the node
