"""Bounds what a transport peer's pings, and the node id any of its requests claims, make this node spend.

hivemind adds the sender of every DHT request (ping, store, find) to its routing table under the node id the request
claims, nothing tying that id to the libp2p peer that sends it; and when the id is new to the table it first loops over
every key held in the local storage (up to ``dht_storage_values``, 16,384: 0.15 s of CPU with 50 neighbours), to copy
to the newcomer the values it should now hold. An id that lands in a full bucket that will not split is never added,
so a peer claiming a fresh id on each ~60-byte ping ran that loop every time (20 such pings: 3.56 s of CPU against
0.15 s with one id; ~6 a second kept the transport's event loop busy), and each such ping also made this node ping an
honest neighbour of that bucket. Two bounds:

- :class:`PingGate` stands in front of the ping handler (:func:`swarm.hivemind_bridge.gate_ping_handler`): each libp2p
  peer (the sender the transport authenticated) may send ``budget`` pings per ``window`` seconds; the ping that goes
  beyond rests the peer (``ping_senders_rested``; :mod:`swarm.rest_book`, as for stores and finds) and its pings are
  answered without being looked at (this node's node id, "not available"; ``rejected/ping_budget``, then
  ``rejected/ping_rested``) until the rest ends.
- :class:`RoutingGuard` decides, for every routing-table update a request or an answer starts
  (:func:`swarm.hivemind_bridge.bound_routing_updates`), which node id a libp2p peer goes under: the first it claimed,
  for :data:`NODE_ID_SECONDS` (a different id meanwhile is read as the first); whether a peer whose id did not fit in
  the table (its bucket full) may try again (once per :data:`JOIN_RETRY_SECONDS`); and whether hivemind's copy of
  stored values to a newcomer runs (once per libp2p peer per :data:`COPY_OUT_SECONDS`, and at most once per
  :data:`COPY_OUT_GAP_SECONDS` over all peers). The copy is a convenience here: a record is served by its publisher,
  or found by a lookup at the nodes that hold it, and index entries are stored again every ``announce_interval``, so
  a newcomer that misses a copy is no loss.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from swarm.rest_book import HostWindows, RestBook, SenderWindow, sender_host
from swarm.transport import SwarmCounters

PING_BUDGET = 16
"""Pings one libp2p peer may send within a window (10 s). hivemind pings a peer when it joins through it
(``DHTNode.create`` pings each initial peer once), when a request from a newcomer finds the newcomer's bucket full (it
pings that bucket's least recently seen node, and not again until that one answered), and when a ping asks to be
checked (``validate``: one ping back); its routing-table refresh looks nodes up (finds), it does not ping. The swarm
pings its neighbours when none of them is connected (``swarm.rejoin``: at most 8, each once, every
``rejoin_interval``), every peer it knew while it rejoins (each once per attempt), and every neighbour once when it
switches between client and server mode. So an honest peer pings this node a few times a minute at most: 16 in 10 s
is far above it."""

PING_HOST_PEERS = 4
"""The peers of one host (:mod:`swarm.peer_hosts`) together may ping this many peers' budgets a window, as they store,
find and fetch records: identities cost a key each, an address does not come as cheap."""

NODE_ID_SECONDS = 600.0
"""How long a libp2p peer keeps the first node id it claimed; another id claimed meanwhile is read as that one. An
honest peer keeps its node id for its life, except when it switches between client and server mode (a new DHT node on
the same libp2p peer, at most every half hour): it is then known here under its former id until this ends, still
reached at its libp2p peer."""

JOIN_RETRY_SECONDS = 5.0
"""How long a libp2p peer whose node id did not fit in the routing table (its bucket full, a neighbour pinged to make
room) waits before its requests try again; meanwhile they update nothing (each try pings a neighbour)."""

COPY_OUT_SECONDS = 3600.0
"""How often hivemind's copy of stored values to a newcomer runs for one libp2p peer at most."""

COPY_OUT_GAP_SECONDS = 10.0
"""How often that copy runs at most, over all peers: it loops over every key stored here (up to 16,384: 0.15 s of
CPU), so fresh libp2p identities cost at most 1.5 % of a core."""

MAX_PEERS = 4096
"""The most libp2p peers :class:`RoutingGuard` remembers; the one seen longest ago goes first."""


@dataclass
class _PingWindow(SenderWindow):
    pings: int = 0

    def clear(self) -> None:
        """Count this peer's pings afresh."""
        self.pings = 0


class PingGate:
    """Per-peer count of pings, and the rest of a peer that pings beyond its budget.

    Parameters:
        counters: where ``rejected/ping_budget``, ``rejected/ping_rested`` and ``ping_senders_rested`` go.
        budget: pings one peer may send within a window (:data:`PING_BUDGET`).
        host_budget_peers: the peers of one host together may send this many peers' budgets a window
            (:data:`PING_HOST_PEERS`; beyond it their pings are answered "not available", ``rejected/ping_host_budget``,
            and nobody rests; this machine's loopback peers keep their own budgets only); ``None``: no bound per host.
        window: seconds over which a peer's pings are counted.
        rest: a peer's first rest in seconds; each further rest doubles it (:mod:`swarm.rest_book`).
        max_senders: the most peers the book holds.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        counters: SwarmCounters,
        budget: int = PING_BUDGET,
        window: float = 10.0,
        rest: float = 30.0,
        max_senders: int = MAX_PEERS,
        host_budget_peers: int | None = PING_HOST_PEERS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.counters = counters
        self.budget = budget
        self.host_budget_peers = host_budget_peers
        self.book = RestBook(_PingWindow, window, rest, max_senders, lambda: counters.add("ping_senders_rested"), clock)
        self._hosts = HostWindows(window, max_senders, clock)  # each host's peers' pings

    def resting(self, sender: str) -> bool:
        """Whether ``sender``'s pings are refused now."""
        return self.book.resting(sender)

    def admit(self, sender: str, host: str | None = None, by_host: bool = False) -> bool:
        """Count a ping of ``sender`` as it arrives, with ``by_host`` into the window of its ``host`` too
        (:mod:`swarm.peer_hosts`; None: not known): whether it is answered (refusals counted by reason; the peer rests
        when it went beyond its own budget)."""
        if self.book.resting(sender):
            self.counters.reject("ping_rested")
            return False
        entry = self.book.entry(sender)
        entry.pings += 1
        if entry.pings > self.budget:
            self.book.start_rest(entry)
            self.counters.reject("ping_budget")
            return False
        window = self._hosts.bounded(host, self.host_budget_peers, by_host)
        if window is not None:
            window.count += 1
            if window.count > self.host_budget_peers * self.budget:
                self.counters.reject("ping_host_budget")
                return False
        return True

    def wrap(
        self,
        rpc_ping: Callable[[Any, Any], Awaitable[Any]],
        refuse: Callable[[Any], Any],
        host_of: Callable[[Any], Awaitable[str | None]] | None = None,
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        """A ping handler: a ping :meth:`admit` refuses is answered ``refuse(request)`` (nothing looked at), any other
        by ``rpc_ping(request, context)``; ``host_of(libp2p PeerID)`` names the sender's host
        (:meth:`swarm.peer_hosts.PeerHosts.host`; None: no bound per host)."""

        async def gated_ping(request: Any, context: Any) -> Any:
            sender = context.remote_id.to_base58()
            host, by_host = await sender_host(self.book, sender, context.remote_id, host_of)
            if not self.admit(sender, host, by_host):
                return refuse(request)
            return await rpc_ping(request, context)

        return gated_ping


@dataclass
class _Known:
    node_id: bytes
    claimed_at: float
    join_refused_at: float = float("-inf")
    copied_at: float = float("-inf")


class RoutingGuard:
    """Which node id each libp2p peer goes under in the routing table, and how often its updates may cost more than a
    table update (:func:`swarm.hivemind_bridge.bound_routing_updates` asks).

    Parameters:
        node_id_seconds: how long a peer keeps the first id it claimed (:data:`NODE_ID_SECONDS`).
        join_retry: seconds a peer refused a place waits (:data:`JOIN_RETRY_SECONDS`).
        copy_out: seconds between two copies to one peer (:data:`COPY_OUT_SECONDS`).
        copy_out_gap: seconds between two copies to any peers (:data:`COPY_OUT_GAP_SECONDS`).
        max_peers: the most peers remembered (:data:`MAX_PEERS`).
        counters: where ``routing_ids_ignored`` (an id differing from the one its peer claimed first) and
            ``routing_copies_skipped`` go (default: counters of its own).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        node_id_seconds: float = NODE_ID_SECONDS,
        join_retry: float = JOIN_RETRY_SECONDS,
        copy_out: float = COPY_OUT_SECONDS,
        copy_out_gap: float = COPY_OUT_GAP_SECONDS,
        max_peers: int = MAX_PEERS,
        counters: SwarmCounters | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.node_id_seconds = node_id_seconds
        self.join_retry = join_retry
        self.copy_out = copy_out
        self.copy_out_gap = copy_out_gap
        self.max_peers = max_peers
        self.counters = counters if counters is not None else SwarmCounters()
        self.clock = clock
        self._peers: dict[str, _Known] = {}  # libp2p peer (base58) -> what it claimed, oldest seen first
        self._last_copy = float("-inf")

    def __len__(self) -> int:
        """How many peers are remembered."""
        return len(self._peers)

    def node_id(self, peer: str, claimed: bytes) -> bytes:
        """The node id ``peer``'s update goes under: the first it claimed while that is younger than
        ``node_id_seconds``, else ``claimed`` (from now on its first)."""
        now = self.clock()
        known = self._peers.pop(peer, None)
        if known is None or now - known.claimed_at > self.node_id_seconds:
            if len(self._peers) >= self.max_peers:
                del self._peers[next(iter(self._peers))]
            known = _Known(claimed, now)
        elif known.node_id != claimed:
            self.counters.add("routing_ids_ignored")
        self._peers[peer] = known  # seen last
        return known.node_id

    def claimed(self, peer: str) -> bytes | None:
        """The node id ``peer`` goes under now (the first it claimed, while younger than ``node_id_seconds``), or None
        when it claimed none here or that time ended; nothing is recorded (an answer naming ``peer`` is no claim of
        its own)."""
        known = self._peers.get(peer)
        if known is None or self.clock() - known.claimed_at > self.node_id_seconds:
            return None
        return known.node_id

    def may_join(self, peer: str) -> bool:
        """Whether ``peer``, not in the routing table, may try for a place (not refused one within ``join_retry``)."""
        known = self._peers.get(peer)
        return known is None or self.clock() - known.join_refused_at >= self.join_retry

    def join_refused(self, peer: str) -> None:
        """``peer``'s id did not fit (a neighbour is pinged to make room): its next tries wait ``join_retry``."""
        known = self._peers.get(peer)
        if known is not None:
            known.join_refused_at = self.clock()

    def may_copy_out(self, peer: str) -> bool:
        """Whether stored values may be copied to ``peer``, a newcomer, now (counted as a copy when so)."""
        now = self.clock()
        known = self._peers.get(peer)
        if now - self._last_copy < self.copy_out_gap or (known is not None and now - known.copied_at < self.copy_out):
            self.counters.add("routing_copies_skipped")
            return False
        self._last_copy = now
        if known is not None:
            known.copied_at = now
        return True
