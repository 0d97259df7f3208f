"""benchmarks/process_memory.py: which processes it watches, growth told from a sawtooth, the written report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks import process_memory


def test_process_kind_watches_nodes_local_swarm_and_p2pd_only():
    python = sys.executable
    assert process_memory.process_kind([python, "-m", "sapo.node.cli", "--model", "default"]) == "node"
    assert process_memory.process_kind(["/venv/bin/sapo-node", "--max_steps", "3"]) == "node"
    assert process_memory.process_kind([python, "-m", "sapo.node.cli", "local-swarm", "--peers", "4"]) == "local-swarm"
    assert process_memory.process_kind(["/venv/lib/hivemind/hivemind_cli/p2pd", "-b=0"]) == "p2pd"
    assert process_memory.process_kind([python, "-m", "pytest"]) is None
    assert process_memory.process_kind([]) is None


def _readings(hours: float, growth_mb_per_hour: float) -> list[dict]:
    """A node whose RSS saws by 100 MB around a trend, and a flat p2pd, read every 5 minutes."""
    out = []
    for k in range(int(hours * 12) + 1):
        t = 1000.0 + 300 * k
        node = 2000 + growth_mb_per_hour * (t - 1000) / 3600 + (100 if k % 2 else 0)
        out.append({"time": t, "load1": 2.0, "processes": [
            {"pid": 7, "kind": "node", "rss_mb": node, "dir": "runs/x"},
            {"pid": 8, "kind": "p2pd", "rss_mb": 80.0, "dir": None},
        ]})  # fmt: skip
    return out


def test_summary_tells_growth_from_a_sawtooth(tmp_path):
    flat = process_memory.summarize(_readings(2, 0.0))["kinds"]
    # a window median may land on either side of the saw: flat reads within 100 MB / 2 over ~1.1 h
    assert abs(flat["node"]["max_growth_mb_per_hour"]) < 60 and flat["p2pd"]["max_growth_mb_per_hour"] == 0
    growing = process_memory.summarize(_readings(2, 300.0))
    assert 250 < growing["kinds"]["node"]["max_growth_mb_per_hour"] < 350
    assert growing["kinds"]["node"]["peak_mb"] > 2500 and abs(growing["hours"] - 2) < 1e-9

    readings = tmp_path / "readings.jsonl"
    readings.write_text("\n".join(json.dumps(r) for r in _readings(2, 300.0)) + "\n")
    process_memory.report(readings, "soak_test", tmp_path, note="a synthetic node")
    page = (tmp_path / "soak_test.md").read_text()
    assert "| node | 1 |" in page and "a synthetic node" in page and (tmp_path / "soak_test.png").stat().st_size > 0


def test_a_reading_finds_a_running_node_process_by_its_command_line():
    # A stand-in whose command line reads as a node's (python -c ... sapo.node.cli), so the reading must list it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "sapo.node.cli", "--output_dir",
                              "out-x"])  # fmt: skip
    try:
        # On a loaded machine the child may still be starting (its command line and memory not yet those of the
        # program): read until it shows, for at most 10 s.
        deadline = time.monotonic() + 10
        while True:
            reading = process_memory.sample()
            mine = [p for p in reading["processes"] if p["pid"] == child.pid]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert mine and mine[0]["kind"] == "node" and mine[0]["dir"] == "out-x" and mine[0]["rss_mb"] > 0
        assert all(p["pid"] != os.getpid() for p in reading["processes"])
    finally:
        child.kill()
        child.wait()


def test_only_under_keeps_the_processes_of_one_run_directory():
    readings = _readings(1, 0.0)
    readings[0]["processes"].append({"pid": 9, "kind": "node", "rss_mb": 500.0, "dir": "/tmp/pytest-1/out"})
    kept = process_memory.only_under(readings, "runs/")
    assert {p["pid"] for r in kept for p in r["processes"]} == {7}  # the test's node and the dir-less p2pd left out
