"""Helpers and pytest fixtures for swarm tests: groups, bounded waits, DHT peers that are always cleaned up.

Import the fixtures into a test module (``from tests.swarm_fixtures import dht_peers, ...``) or a
conftest. Every p2pd a fixture starts is recorded in :data:`STARTED_P2PD` by its identity (pid and start time), so
a module can assert at its end that none of its own survived, without touching processes these tests did not start:
a pid freed by a stopped daemon is soon another process's, another program's p2pd included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from swarm.daemon import ProcessIdentity
from swarm.records import Group, Provenance
from testbed.dht_peers import dht_peer_factory, kill_p2pd
from testbed.netns import Hosts

STARTED_P2PD: dict[ProcessIdentity, list[str]] = {}
"""p2pd -> its socket files, for every daemon started by these fixtures (and by tests that record theirs)."""


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


def record_p2pd(daemon: ProcessIdentity | int | None, sockets: list[str] = ()) -> None:
    """Remember a p2pd started by a test, for the end-of-module check. A bare pid is read as the process that has it
    now: pass it while the daemon certainly runs (right after it started)."""
    if isinstance(daemon, int):
        daemon = ProcessIdentity.of(daemon)
    if daemon is not None:
        STARTED_P2PD[daemon] = list(sockets)


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


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """Inside the block, the objects alive when it starts (torch, transformers, hivemind: ~500k) are left out of
    garbage collections (``gc.freeze``).

    Every peer's close runs a full collection so that no unreachable transport of its event loop is finalized after
    the loop closed; over all those objects one costs 1-4 s on 2 busy cores, i.e. most of a swarm test's teardown.
    What is frozen was collected first and existed before any of the module's peers, so none of it is garbage bound
    to a peer's loop: those collections still find everything they exist to find."""
    import swarm.dht  # noqa: F401  (hivemind, and torch with it: what the peers would import, frozen too)
    from sapo.collector import long_lived_frozen

    with long_lived_frozen(collect_first=True):
        yield


@pytest.fixture
def dht_peers() -> Iterator[Callable[..., Any]]:
    """Factory of DHTTransport peers (fast settings), each recorded for the end-of-module check; every peer is closed,
    and its p2pd killed, at teardown."""
    with dht_peer_factory(FAST, on_start=lambda peer: record_p2pd(peer.p2pd, peer.socket_paths)) as make:
        yield make


@contextlib.contextmanager
def p2pd_left_behind_checked(grace: float = 10.0) -> Iterator[None]:
    """On leaving: assert that no p2pd recorded inside the block still runs ``grace`` s later and no socket of theirs
    remains; whatever remains is killed (by identity) and removed.

    Only daemons recorded inside the block, each by its pid and start time: a daemon recorded earlier stopped long
    ago, and its pid may be another program's p2pd by now."""
    before = set(STARTED_P2PD)
    yield
    mine = {daemon: paths for daemon, paths in STARTED_P2PD.items() if daemon not in before}
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(daemon.running() for daemon in mine):
        time.sleep(0.1)
    alive = [daemon for daemon in mine if daemon.running()]
    for daemon in alive:
        kill_p2pd(daemon)
    sockets = [path for paths in mine.values() for path in paths if os.path.exists(path)]
    for path in sockets:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    assert not alive, f"p2pd processes left running: {alive}"
    assert not sockets, f"socket files left behind: {sockets}"


@pytest.fixture(scope="module")
def no_p2pd_left_behind() -> Iterator[None]:
    """Module fixture: at the end, assert no p2pd this module's tests started still runs and no socket remains
    (see :func:`p2pd_left_behind_checked`); meanwhile what was alive before the module is frozen out of garbage
    collections (see :func:`imports_frozen`)."""
    with p2pd_left_behind_checked(), imports_frozen():
        yield


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    """Three hosts in network namespaces of their own, joined by veth links (:class:`testbed.netns.Hosts`), removed
    after the test; the test skips where namespaces cannot be made (no iproute2, no root or CAP_NET_ADMIN)."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (the ip command) is not installed")
    made = Hosts(3)
    try:
        made.create()
    except (subprocess.CalledProcessError, OSError) as e:
        made.remove()
        detail = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) and e.stderr else e
        pytest.skip(f"cannot create network namespaces here (needs root or CAP_NET_ADMIN): {detail}")
    try:
        yield made
    finally:
        made.remove()


class GateClock:
    """A monotonic clock the gates' tests move by hand (``clock.now += seconds``)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
