"""Warm starts: `sapo-node` processes forked from a server that imported the libraries once behave as started cold."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from sapo.node.warm_start import SHARED, WarmProcess, WarmStarter, WarmStartRefused, start_node_process
from tests.node_fixtures import _node_command

CLI = [sys.executable, "-m", "sapo.node.cli"]


@pytest.fixture(scope="module")
def starter():
    made = WarmStarter({k: v for k, v in os.environ.items() if k != "SAPO_READ_LATER"}, frozenset({"SAPO_READ_LATER"}))
    yield made
    made.close()


def test_a_warm_process_has_the_exit_code_and_output_of_a_cold_one(starter, tmp_path):
    version = starter.start(["--version"], stdout=subprocess.PIPE)
    assert version.wait(120) == 0 and version.stdout.read().startswith(b"sapo-node (sapo-swarm)")
    cold = subprocess.run([*CLI, "--version"], capture_output=True, timeout=120)
    assert cold.stdout.startswith(b"sapo-node (sapo-swarm)")

    with open(tmp_path / "out.txt", "wb") as out:  # stderr into the same file, as local-swarm's node.out
        refused = starter.start(["--no-such-option"], stdout=out, stderr=subprocess.STDOUT)
        assert refused.wait(120) == 2 and refused.poll() == 2 and refused.returncode == 2
    assert "unknown option(s): --no-such-option" in (tmp_path / "out.txt").read_text()

    # the working directory is the one asked for: a relative --config resolves against it
    (tmp_path / "mine.yaml").write_text("num_generations: 8\n")
    config = starter.start(["--config", "mine.yaml", "--print-config"], stdout=subprocess.PIPE, cwd=tmp_path)
    assert config.wait(120) == 0 and b"num_generations: 8" in config.stdout.read()


def test_a_signal_ends_a_warm_process_and_wait_times_out_like_popen(starter, tmp_path, tiny_model_a):
    out = tmp_path / "node"
    command = _node_command(tiny_model_a, out, "--wait_for_peers", "1", "--wait_for_peers_timeout", "600")
    with open(tmp_path / "node.err", "wb") as err:
        node = start_node_process(command, starter=starter, stdout=subprocess.DEVNULL, stderr=err)
    assert isinstance(node, WarmProcess) and node.pid != os.getpid()
    with pytest.raises(subprocess.TimeoutExpired):
        node.wait(timeout=0.5)
    deadline = time.monotonic() + 300
    while "waiting up to" not in (tmp_path / "node.err").read_text() and time.monotonic() < deadline:
        assert node.poll() is None, (tmp_path / "node.err").read_text()[-2000:]
        time.sleep(0.5)
    node.send_signal(signal.SIGKILL)
    assert node.wait(60) == -signal.SIGKILL


def test_only_a_node_command_in_the_servers_environment_starts_warm(starter, tmp_path, monkeypatch):
    assert isinstance(start_node_process([*CLI, "--version"], starter=starter, stdout=subprocess.DEVNULL), WarmProcess)
    other = {**os.environ, "PYTHONPATH": str(tmp_path)}  # read at interpreter start: the fork would ignore it
    with pytest.raises(WarmStartRefused, match="differs"):
        starter.start(["--version"], env=other)
    cold = start_node_process([*CLI, "--version"], starter=starter, env=other, stdout=subprocess.DEVNULL)
    assert isinstance(cold, subprocess.Popen) and cold.wait(120) == 0
    script = start_node_process([sys.executable, "-c", "pass"], starter=starter)
    assert isinstance(script, subprocess.Popen) and script.wait(60) == 0
    # a variable the starter declared read after import, and one a test may change, do not matter
    declared = {**os.environ, "SAPO_READ_LATER": "1", "PYTEST_CURRENT_TEST": "another"}
    assert starter.start(["--version"], env=declared, stdout=subprocess.DEVNULL).wait(120) == 0

    # a process that finds SAPO_WARM_START uses that server: no server of its own
    monkeypatch.setenv(SHARED, starter.address)
    shared = WarmStarter.shared()
    assert shared is not None and shared.address == starter.address
    assert isinstance(start_node_process([*CLI, "--version"], starter=shared, stdout=subprocess.DEVNULL), WarmProcess)
    unasked = start_node_process([*CLI, "--version"], stdout=subprocess.DEVNULL)  # no starter given: cold
    assert isinstance(unasked, subprocess.Popen) and unasked.wait(120) == 0
    monkeypatch.delenv(SHARED)
    assert WarmStarter.shared() is None


def test_a_script_starts_warm_as_python_runs_it(starter, tmp_path):
    """`python SCRIPT ARGS` forked warm: run as __main__, its arguments, its folder first on the path, the working
    directory asked for, its exit code; a module beside it imports as it would cold."""
    (tmp_path / "helper.py").write_text("WORD = 'beside'\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "import helper\n"
        "print(__name__, sys.argv[1:], helper.WORD, os.getcwd(), sys.path[0] == os.path.dirname(__file__))\n"
        "sys.exit(int(sys.argv[2]))\n"
    )
    (tmp_path / "work").mkdir()
    process = start_node_process(
        [sys.executable, str(script), "--steps", "3"], starter=starter, stdout=subprocess.PIPE, cwd=tmp_path / "work"
    )
    assert isinstance(process, WarmProcess) and process.args[:2] == [sys.executable, str(script)]
    assert process.wait(120) == 3
    assert process.stdout.read().decode() == f"__main__ ['--steps', '3'] beside {tmp_path / 'work'} True\n"
    # `python -m` of any other module, or another program, starts cold
    cold = start_node_process([sys.executable, "-c", "pass"], starter=starter)
    assert isinstance(cold, subprocess.Popen) and cold.wait(60) == 0
