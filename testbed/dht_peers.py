"""DHTTransport peers on 127.0.0.1 that are always stopped: the factory the swarm tests' fixture and the benchmarks
share, and the kill of a p2pd that never signals a process that reused its pid."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from swarm.daemon import ProcessIdentity

if TYPE_CHECKING:
    from swarm.dht import DHTTransport


def kill_p2pd(daemon: ProcessIdentity, timeout: float = 5.0) -> None:
    """SIGKILL ``daemon`` if that very process still runs (never another process that reused its pid), and wait up to
    ``timeout`` s until it no longer runs. Its exit status is left to whoever started it (hivemind's child watcher, a
    test's ``Popen``): reaping it here would leave them a lost status (``Popen.wait`` then reads 0)."""
    if daemon.kill():
        deadline = time.monotonic() + timeout
        while daemon.running() and time.monotonic() < deadline:
            time.sleep(0.02)


@contextlib.contextmanager
def dht_peer_factory(
    defaults: Mapping[str, Any] | None = None, on_start: Callable[[DHTTransport], None] | None = None
) -> Iterator[Callable[..., DHTTransport]]:
    """``make(**config)`` -> a DHTTransport with ``defaults`` under ``config`` (``on_start`` is told of each); at exit
    every peer made is closed, its p2pd killed if that very daemon still runs and its socket files removed."""
    from swarm.dht import DHTTransport

    made: list[DHTTransport] = []

    def make(**config: Any) -> DHTTransport:
        peer = DHTTransport(**{**(defaults or {}), **config})
        made.append(peer)
        if on_start is not None:
            on_start(peer)
        return peer

    try:
        yield make
    finally:
        for peer in made:
            with contextlib.suppress(Exception):
                peer.close()
            if peer.p2pd is not None:
                kill_p2pd(peer.p2pd)  # last resort: close() should have stopped it already
            for path in peer.socket_paths:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
