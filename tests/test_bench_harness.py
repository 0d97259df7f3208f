"""The benchmarks' shared harness (benchmarks/harness.py): run record, /proc readings, stopping, report writing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from benchmarks import harness


def test_run_record_names_command_commit_date_and_machine():
    record = harness.run_record("python benchmarks/x.py --quick")
    assert record["command"] == "python benchmarks/x.py --quick"
    state = harness.git_state()
    assert record["git_commit"] == harness.code_label(state) and len(state["commit"]) == 40
    assert harness.code_label({"commit": "abcdef1234567", "dirty": True}, 7) == "abcdef1 (dirty tree)"
    assert harness.code_label({}) == "unrecorded"
    assert "CPUs" in record["machine"] and record["date"].endswith("+00:00")
    command, commit = harness.record_lines(record)  # a result page names them
    assert command == "Command: `python benchmarks/x.py --quick`  "
    assert commit == f"Commit: `{record['git_commit']}`, {record['date']}, {record['machine']}  "


def test_proc_readings_of_this_process_and_of_a_gone_one():
    assert 10 < harness.rss_mb(os.getpid()) <= harness.rss_mb(os.getpid(), "VmHWM")
    assert harness.cpu_seconds(os.getpid()) > 0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in harness.children(os.getpid())
    finally:
        harness.stop_processes([child], grace=5)
    assert harness.rss_mb(child.pid) is None and harness.cpu_seconds(child.pid) == 0.0


def test_stop_processes_kills_what_ignores_sigterm():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    stubborn = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stubborn.stdout.readline() == "up\n"  # its handler is set before it is asked to stop
    codes = harness.stop_processes([stubborn, polite], grace=0.5)
    assert codes == [-9, -15]  # killed after the grace, not waited for: its sleep would have ended with 0
    stubborn.stdout.close()


def test_reports_write_nan_as_null(tmp_path):
    paths = harness.write_report(tmp_path / "out", "bench", {"settings": {"n": 1}, "x": math.nan}, ["# t", "row"])
    assert json.loads(paths["json"].read_text()) == {"settings": {"n": 1}, "x": None}
    assert paths["md"].read_text() == "# t\nrow\n"


def test_a_rewritten_result_leaves_the_tree_clean_and_a_changed_source_does_not(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "page.md").write_text("first run\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (tmp_path / "benchmarks" / "results" / "page.md").write_text("second run\n")  # a resumable run's report
    assert harness.git_state(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert harness.git_state(tmp_path)["dirty"] is True
