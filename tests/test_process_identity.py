"""A process is known by its pid and its start time: a pid reused by another process (another program's p2pd
included) is never claimed, reported or signalled, by the tests' leftover check or by a node's cleanup; nor is the
socket file of a daemon that is starting removed as stale."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.daemon import STATE_FILE, ProcessIdentity, cleanup_stale_state, remove_stale_sockets_since
from tests.swarm_fixtures import STARTED_P2PD, p2pd_left_behind_checked, record_p2pd

# A process whose command line names p2pd, as a daemon's does, but which sleeps.
LOOKS_LIKE_P2PD = [sys.executable, "-c", "import time; time.sleep(600)", "p2pd"]


@pytest.fixture
def own() -> Iterator[list[subprocess.Popen]]:
    """Processes this test starts; each killed by its Popen handle at the end, whatever happened."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait(timeout=30)


@pytest.fixture
def recorded() -> Iterator[None]:
    """STARTED_P2PD as it was, restored after a test that records processes which are not daemons."""
    saved = dict(STARTED_P2PD)
    yield
    STARTED_P2PD.clear()
    STARTED_P2PD.update(saved)


def start(own: list[subprocess.Popen], argv: list[str]) -> tuple[subprocess.Popen, ProcessIdentity]:
    """Start ``argv`` and return it once its command line shows (Popen returns as soon as exec begins; until the
    kernel has set the new program's arguments up, /proc shows an empty command line, which on a loaded machine
    lasts long enough for a check that it is a p2pd to see nothing)."""
    process = subprocess.Popen(argv)
    own.append(process)
    identity = ProcessIdentity.of(process.pid)
    assert identity is not None
    deadline = time.monotonic() + 30
    while not Path(f"/proc/{process.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    return process, identity


def forged(identity: ProcessIdentity) -> ProcessIdentity:
    """The same pid with another start time: what a recorded pid looks like once another process reused it."""
    return ProcessIdentity(identity.pid, identity.start - 1)


def test_a_recorded_pid_whose_start_time_differs_is_not_that_process(own):
    process, identity = start(own, ["sleep", "600"])
    assert identity.running() and ProcessIdentity.of(process.pid) == identity
    impostor = forged(identity)
    assert not impostor.running()
    assert impostor.kill() is False
    assert process.poll() is None  # not signalled
    assert identity.kill() is True
    assert process.wait(timeout=10) == -9
    assert not identity.running() and identity.kill() is False


def test_the_leftover_check_claims_only_daemons_recorded_in_its_block_and_by_identity(own, recorded):
    earlier, earlier_id = start(own, LOOKS_LIKE_P2PD)
    record_p2pd(earlier_id)  # recorded before the block: an earlier module's daemon, not this block's to judge
    reused, reused_id = start(own, LOOKS_LIKE_P2PD)
    with p2pd_left_behind_checked(grace=0.5):
        record_p2pd(forged(reused_id), ["/nonexistent/p2pd.sock"])  # a recorded pid now another process's
    assert earlier.poll() is None and reused.poll() is None  # neither reported nor signalled

    leftover, _ = start(own, LOOKS_LIKE_P2PD)
    with pytest.raises(AssertionError, match=rf"p2pd processes left running: \[ProcessIdentity\(pid={leftover.pid},"):
        with p2pd_left_behind_checked(grace=0.5):
            record_p2pd(leftover.pid)  # a bare pid, read while it runs
    assert leftover.wait(timeout=10) == -9  # its own leftover is reported and killed
    assert earlier.poll() is None and reused.poll() is None


def test_a_node_start_kills_only_the_very_p2pd_its_crashed_run_recorded(own, tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()  # the crashed run's Python process: gone
    daemon, identity = start(own, LOOKS_LIKE_P2PD)
    state = {"python_pid": gone.pid, "p2pd_pid": identity.pid, "sockets": []}

    (tmp_path / STATE_FILE).write_text(json.dumps({**state, "p2pd_start": identity.start - 1}))
    cleanup_stale_state(str(tmp_path))  # the pid now names another process: left alone
    assert daemon.poll() is None and not (tmp_path / STATE_FILE).exists()

    (tmp_path / STATE_FILE).write_text(json.dumps(state))  # written before start times were recorded: no kill
    cleanup_stale_state(str(tmp_path))
    assert daemon.poll() is None and not (tmp_path / STATE_FILE).exists()

    (tmp_path / STATE_FILE).write_text(json.dumps({**state, "p2pd_start": identity.start}))
    cleanup_stale_state(str(tmp_path))  # the very daemon, its parent gone: killed
    assert daemon.wait(timeout=10) == -9 and not os.path.exists(tmp_path / STATE_FILE)


def test_a_socket_bound_but_not_yet_listening_is_not_removed_as_stale():
    """Between its bind and its listen a starting daemon's socket refuses connections; a peer that cleans up after a
    failed start (of this program or another) must not take it for a dead daemon's file."""
    path = f"/tmp/hivemind-p2pd-identity-test-{os.getpid()}.sock"
    since = time.time()
    starting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        starting.bind(path)  # not listening: a connect is refused
        remove_stale_sockets_since(since)
        assert os.path.exists(path)
    finally:
        starting.close()
    remove_stale_sockets_since(since)  # nobody holds it now: garbage
    assert not os.path.exists(path)
