"""benchmarks.suite_profile: a pytest run with the plugin records each test's own and its children's CPU, and the
page ranks the test files by it; without SUITE_PROFILE_LOG nothing is recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import suite_profile

ROOT = Path(__file__).resolve().parents[1]

TESTS = """
import subprocess, sys

def test_quick():
    assert True

def test_starts_a_busy_child():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(4_000_000))"], check=True)
"""


def run_pytest(tmp_path: Path, log: Path | None) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "SUITE_PROFILE_LOG"}
    env["PYTHONPATH"] = str(ROOT)
    if log is not None:
        env["SUITE_PROFILE_LOG"] = str(log)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.suite_profile", "-p", "no:cacheprovider",
               "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")]  # fmt: skip
    subprocess.run(command, cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)


def test_each_test_is_recorded_with_its_childrens_cpu_and_the_page_ranks_files(tmp_path, capsys):
    log = tmp_path / "profile"
    run_pytest(tmp_path, log)
    records = {r["test"].split("::")[1]: r for r in map(json.loads, Path(f"{log}.tests").read_text().splitlines())}
    assert set(records) == {"test_quick", "test_starts_a_busy_child"}
    busy, quick = records["test_starts_a_busy_child"], records["test_quick"]
    assert busy["children_cpu"] > 0.05 and quick["children_cpu"] == 0 and busy["wall"] >= busy["children_cpu"] * 0.5
    # The busy child recorded itself at exit (the hook on PYTHONPATH), under the test that started it.
    processes = [json.loads(line) for line in Path(f"{log}.procs").read_text().splitlines()]
    (child,) = [p for p in processes if (p["test"] or "").startswith("test_sample.py::test_starts_a_busy_child")]
    assert child["argv"] == ["-c"] and child["cpu"] > 0.05
    lines = suite_profile.main([str(log), "--top", "1"])
    assert lines[0].startswith("2 tests:") and "| test_sample.py | 2 |" in "\n".join(lines)
    page = "\n".join(lines)
    assert "| test_sample.py::test_starts_a_busy_child |" in page  # the costliest test alone
    assert "Python processes recorded themselves" in page


def test_without_the_variable_nothing_is_recorded(tmp_path):
    run_pytest(tmp_path, None)
    assert not list(tmp_path.glob("*.tests")) and not list(tmp_path.glob("*.procs"))
