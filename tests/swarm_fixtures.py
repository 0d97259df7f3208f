"""Helpers and pytest fixtures for swarm tests: groups, bounded waits, DHT peers that are always cleaned up.

Import the fixtures into a test module (``from tests.swarm_fixtures import dht_peers, ...``) or a
conftest. Every p2pd a fixture starts is recorded in :data:`STARTED_P2PD`, so a module can assert at its
end that none survived, without touching processes these tests did not start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from swarm.records import Group, Provenance

STARTED_P2PD: dict[int, list[str]] = {}
"""p2pd pid -> its socket files, for every daemon started by these fixtures (and by tests that record theirs)."""


def make_group(group_id: str, completion_chars: int = 64, completions: int = 4, **overrides: Any) -> Group:
    """A valid group with ``completions`` completions of ``completion_chars`` characters each."""
    fields: dict[str, Any] = dict(
        group_id=group_id,
        prompt=[{"role": "user", "content": f"What is {group_id}?"}],
        completions=[
            (f"answer {group_id} {i} " * (completion_chars // 8 + 1))[:completion_chars] for i in range(completions)
        ],
        provenance=Provenance(source="reasoning_gym", dataset="basic_arithmetic", config={"size": 10}, seed=1, index=3),
        metadata={"answer": "4"},
        model="tiny",
        step=1,
        created_at=time.time(),
    )
    fields.update(overrides)
    return Group(**fields)


def wait_until(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, message: str = "") -> Any:
    """Poll ``condition`` until it returns something truthy (returned) or ``timeout`` s pass (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s {message}".strip())
        time.sleep(interval)


def pid_running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_p2pd(pid: int) -> None:
    """SIGKILL ``pid`` if it still runs a p2pd (never another process that reused the pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"p2pd" not in f.read():
                return
        os.kill(pid, signal.SIGKILL)
    except (OSError, ProcessLookupError):
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def record_p2pd(pid: int | None, sockets: list[str] = ()) -> None:
    """Remember a p2pd started by a test, for the end-of-module check."""
    if pid is not None:
        STARTED_P2PD[pid] = list(sockets)


FAST = dict(
    poll_interval=0.1,
    wait_timeout=1.0,
    join_timeout=20.0,
    health_interval=0.2,
    index_refresh_interval=1.0,
    index_min_interval=0.2,
    announce_interval=2.0,
)
"""DHTTransport settings that make tests fast on loopback."""


@pytest.fixture
def dht_peers() -> Iterator[Callable[..., Any]]:
    """Factory of DHTTransport peers (fast settings); every peer is closed, and its p2pd killed, at teardown."""
    from swarm.dht import DHTTransport

    created: list[DHTTransport] = []

    def make(**config: Any) -> DHTTransport:
        peer = DHTTransport(**{**FAST, **config})
        created.append(peer)
        record_p2pd(peer.p2pd_pid, peer.socket_paths)
        return peer

    try:
        yield make
    finally:
        for peer in created:
            with contextlib.suppress(Exception):
                peer.close()
            if peer.p2pd_pid is not None:
                kill_p2pd(peer.p2pd_pid)  # last resort: close() should have stopped it already
            for path in peer.socket_paths:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)


@pytest.fixture(scope="module")
def no_p2pd_left_behind() -> Iterator[None]:
    """Module fixture: at the end, assert no p2pd recorded by these tests still runs and no socket remains."""
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_running(pid) for pid in STARTED_P2PD):
        time.sleep(0.1)
    alive = [pid for pid in STARTED_P2PD if pid_running(pid)]
    for pid in alive:
        kill_p2pd(pid)
    sockets = [path for paths in STARTED_P2PD.values() for path in paths if os.path.exists(path)]
    for path in sockets:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    assert not alive, f"p2pd processes left running: {alive}"
    assert not sockets, f"socket files left behind: {sockets}"
