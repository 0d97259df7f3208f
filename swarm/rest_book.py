"""Who rests: one book of libp2p peers, each with what it sent in its current window and its rests, shared by the
gates in front of this node's handlers (:mod:`swarm.store_gate`, :mod:`swarm.find_gate`, :mod:`swarm.serve_gate`,
:mod:`swarm.ping_gate`); the windows of hosts whose peers share a budget (:class:`HostWindows`), each gate's bound per
host applied by one rule (:meth:`HostWindows.bounded`); and the host lookup a resting peer is spared
(:func:`sender_host`).

A gate counts what a peer's requests hold into the peer's window (its own kind of :class:`SenderWindow`), and rests a
peer that went beyond its bounds: for ``rest`` seconds, doubling on each further rest up to :data:`MAX_REST_SECONDS`;
what a peer sends while it rests is not counted. The book holds at most ``max_senders`` peers, the oldest not resting
among the :data:`EVICTION_SCAN` oldest leaving first (else the oldest), so fresh libp2p identities cannot grow it, and
a book full of resting peers costs each newcomer a bounded scan, not one over the whole book.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from swarm.peer_hosts import is_this_machine

MAX_REST_SECONDS = 600.0
"""The longest rest of a peer."""

EVICTION_SCAN = 32
"""The oldest entries a full book looks through for one not resting to drop; if all of them rest, the oldest goes
(an identity's rest is worth little against one that makes identities, and a scan of the whole book for each of its
new ones cost it ~70 µs at 4,096 resting peers)."""


@dataclass
class SenderWindow:
    """One peer's window (when it began) and rests; a gate's subclass adds what it counts, zeroed by :meth:`clear`."""

    window_began: float
    rests: int = 0
    rests_until: float = 0.0

    def start_window(self, at: float) -> None:
        """Count afresh from ``at``."""
        self.window_began = at
        self.clear()

    def clear(self) -> None:
        """Zero what the window counted (nothing here)."""


W = TypeVar("W", bound=SenderWindow)


class RestBook(Generic[W]):
    """The peers a gate counts, by libp2p id (base58).

    Parameters:
        new_window: a peer's first window, begun at the time given.
        window: seconds over which a peer's requests are counted together.
        rest: a peer's first rest in seconds; each further rest doubles it, up to :data:`MAX_REST_SECONDS`.
        max_senders: the most peers the book holds.
        on_rest: called on each rest (a gate counts it).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        new_window: Callable[[float], W],
        window: float,
        rest: float,
        max_senders: int,
        on_rest: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.new_window = new_window
        self.window = window
        self.rest = rest
        self.max_senders = max_senders
        self.on_rest = on_rest
        self.clock = clock
        self._entries: dict[str, W] = {}

    def __len__(self) -> int:
        """How many peers the book holds."""
        return len(self._entries)

    def resting(self, sender: str) -> bool:
        """Whether ``sender`` rests now."""
        entry = self._entries.get(sender)
        return entry is not None and entry.rests_until > self.clock()

    def entry(self, sender: str) -> W:
        """``sender``'s current window (a new one once its last ended; a new peer may push the oldest out)."""
        now = self.clock()
        entry = self._entries.get(sender)
        if entry is None:
            if len(self._entries) >= self.max_senders:
                self._evict(now)
            entry = self._entries[sender] = self.new_window(now)
        elif now - entry.window_began > self.window:
            entry.start_window(now)
        return entry

    def start_rest(self, entry: W) -> None:
        """Rest the peer of ``entry``: its next rest, doubled from the last; what it sends meanwhile is not counted."""
        entry.rests += 1
        entry.rests_until = self.clock() + min(self.rest * 2 ** (entry.rests - 1), MAX_REST_SECONDS)
        entry.start_window(entry.rests_until)
        self.on_rest()

    def _evict(self, now: float) -> None:
        """Drop the oldest entry not resting among the :data:`EVICTION_SCAN` oldest (all of them rest: the oldest)."""
        for sender, entry in itertools.islice(self._entries.items(), EVICTION_SCAN):
            if entry.rests_until <= now:
                del self._entries[sender]
                return
        del self._entries[next(iter(self._entries))]


async def sender_host(
    book: RestBook, sender: str, peer_id: Any, host_of: Callable[[Any], Awaitable[str | None]] | None
) -> tuple[str | None, bool]:
    """The host of ``sender`` (libp2p ``peer_id``) by ``host_of`` (:meth:`swarm.peer_hosts.PeerHosts.host`), and
    whether it was looked up: not without ``host_of``, nor while ``sender`` rests in ``book`` (a resting peer costs no
    lookup). A host not looked up is None."""
    looked_up = host_of is not None and not book.resting(sender)
    return (await host_of(peer_id) if looked_up else None), looked_up


UNLISTED = "unlisted"
"""The host that the peers whose address the daemon does not list count to together."""


@dataclass
class HostWindow:
    """What the peers of one host sent in its current window: requests or values (``count``) and bytes."""

    began: float
    count: int = 0
    nbytes: int = 0


class HostWindows:
    """The current window of each host (:mod:`swarm.peer_hosts`) whose peers share a budget, at most ``max_hosts``
    of them (the window begun longest ago forgotten first).

    Parameters:
        window: seconds over which a host's peers' requests are counted together.
        max_hosts: the most hosts held.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, window: float, max_hosts: int, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self.max_hosts = max_hosts
        self.clock = clock
        self._windows: dict[str, HostWindow] = {}

    def of(self, host: str | None) -> HostWindow | None:
        """``host``'s current window (a new one once its last ended); None for this machine's loopback, whose peers
        (a swarm on one machine, its operator's) keep their own budgets only. The peers of no known host (None)
        share the window of :data:`UNLISTED`."""
        if host is not None and is_this_machine(host):
            return None
        host = host if host is not None else UNLISTED
        now = self.clock()
        window = self._windows.get(host)
        if window is None or now - window.began > self.window:
            self._windows.pop(host, None)
            if len(self._windows) >= self.max_hosts:
                del self._windows[next(iter(self._windows))]  # the window begun longest ago
            window = self._windows[host] = HostWindow(began=now)
        return window

    def bounded(self, host: str | None, peers: int | None, looked_up: bool = True) -> HostWindow | None:
        """``host``'s window (:meth:`of`) where a gate's bound per host applies, else None: a bound is set (``peers``,
        the peers' budgets a host's peers share; None: no bound), the host was looked up where the gate looks it up
        (``looked_up``, :func:`sender_host`), and it is not this machine's loopback."""
        return self.of(host) if looked_up and peers is not None else None
