"""Bounds what one transport peer's find requests make this node build and send: how many keys a request may name,
and what one peer's requests may take within a window; a peer beyond it rests.

hivemind's DHT answers a find request by copying, for every key it names, the whole value stored under it (a
dictionary value, such as an index shard, serialized again) and the key's nearest neighbours from the routing table,
building the answer whole in memory before p2pd's 4 MiB message cap applies. Nothing there bounds the keys, their
repeats or the answer's size: a 1.4 KiB request naming one 2.86 MiB value 64 times made hivemind build a 183 MiB answer
(+553 MiB of memory, 1.2 s of CPU); 180,000 small keys cost 48 s of CPU, holding the GIL and the transport's event
loop. :class:`FindGate` sits in front of the find handler (:func:`swarm.hivemind_bridge.gate_find_handler` builds the
answer itself, each distinct key answered once and values added only while the answer stays under p2pd's cap; the
other keys are answered with neighbours only, so the answer stays one an honest caller reads). The gate refuses a
request naming more than ``max_keys`` keys (``rejected/find_too_many_keys``, counted as ``max_keys + 1`` keys), and
counts, per libp2p peer (the sender the transport authenticated), the keys its requests name and the value bytes its
answers held, in a window of ``window`` seconds: a request that takes a peer beyond ``budget_keys`` keys, or arrives
once its answers held ``budget_bytes``, rests the peer (``find_senders_rested``; :mod:`swarm.rest_book`, the store
gate's rests), and its finds are answered with an empty answer (``rejected/find_budget``, then
``rejected/find_rested``) until the rest ends. An answer never holds more value bytes than what is left of its peer's
budget.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from swarm.rest_book import HostWindows, RestBook, SenderWindow, sender_host
from swarm.transport import SwarmCounters

MAX_FIND_KEYS = 64
"""The most keys one find request may name. hivemind's own lookups name a handful: ``DHTNode.get_many_by_id`` packs at
most ``min(sqrt(keys sought), chunk_size)`` keys into one find (``chunk_size``: 16 by default, the swarm keeps it), and
``DHTNode.find_nearest_nodes`` (a store's search for where to store) ``sqrt(keys stored at once)``; the swarm looks up
and stores a few keys at a time (its records three to a ``get_many``, its index shards and levels). 64 is four times
the chunk, and a store of 4096 keys at once."""

FIND_BUDGET_KEYS = 4096
"""Keys one peer's find requests may name within a window (10 s): each costs this node a search of its routing table
(tens of microseconds). An honest peer's reads name the index shards and a few records a poll, and hivemind's
searches ask each node a few times per key: far below it."""

FIND_BUDGET_BYTES = 64 * 2**20
"""Value bytes one peer's find answers may hold within a window (10 s), the default of ``find_budget_bytes``."""

FIND_HOST_PEERS = 4
"""The peers of one host (:mod:`swarm.peer_hosts`) together take at most this many peers' budgets a window: identities
cost a key each, an address does not come as cheap (the store gate's rule, ``store_budget_host_peers``)."""


@dataclass
class _FindWindow(SenderWindow):
    keys: int = 0
    nbytes: int = 0

    def clear(self) -> None:
        """Count this peer's keys and answer bytes afresh."""
        self.keys, self.nbytes = 0, 0


Answer = Callable[[Any, Any, int], Awaitable[tuple[Any, int]]]
"""``answer(request, context, room)``: the answer to a find request holding at most ``room`` value bytes, and the value
bytes it holds (:func:`swarm.hivemind_bridge.gated_find`)."""


class FindGate:
    """Per-peer accounting of find requests, and the rest of a peer that asks beyond its budget.

    Parameters:
        counters: where ``rejected/find_too_many_keys``, ``rejected/find_budget``, ``rejected/find_rested`` (find
            requests refused) and ``find_senders_rested`` go.
        max_keys: the most keys one request may name (:data:`MAX_FIND_KEYS`); a request naming more is refused.
        budget_keys: keys one peer's requests may name within a window (:data:`FIND_BUDGET_KEYS`).
        budget_bytes: value bytes one peer's answers may hold within a window (:data:`FIND_BUDGET_BYTES`).
        host_budget_peers: the peers of one host together may take this many peers' budgets a window
            (:data:`FIND_HOST_PEERS`; beyond it their finds are refused, ``rejected/find_host_budget``, and nobody
            rests: honest peers behind one NAT share it; this machine's loopback peers keep their own budgets only);
            ``None``: no bound per host.
        window: seconds over which a peer's keys and answer bytes are counted.
        rest: a peer's first rest in seconds; each further rest doubles it (:mod:`swarm.rest_book`).
        max_senders: the most peers the book holds.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        counters: SwarmCounters,
        max_keys: int = MAX_FIND_KEYS,
        budget_keys: int = FIND_BUDGET_KEYS,
        budget_bytes: int = FIND_BUDGET_BYTES,
        window: float = 10.0,
        rest: float = 30.0,
        max_senders: int = 4096,
        host_budget_peers: int | None = FIND_HOST_PEERS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.counters = counters
        self.max_keys = max_keys
        self.budget_keys = budget_keys
        self.budget_bytes = budget_bytes
        self.host_budget_peers = host_budget_peers
        self.book = RestBook(_FindWindow, window, rest, max_senders, lambda: counters.add("find_senders_rested"), clock)
        self._hosts = HostWindows(window, max_senders, clock)  # what each host's peers' finds named and took

    def resting(self, sender: str) -> bool:
        """Whether ``sender``'s find requests are refused now."""
        return self.book.resting(sender)

    def admit(self, sender: str, keys: int, host: str | None = None, by_host: bool = False) -> int | None:
        """Count a find request of ``sender`` naming ``keys`` keys as it arrives, with ``by_host`` into the window of
        its ``host`` too (:mod:`swarm.peer_hosts`; None: not known): the value bytes its answer may hold (what is left
        of the peer's budget and its host's), or None when it is refused (counted by reason; the peer rests when it
        went beyond its own budget)."""
        if self.book.resting(sender):
            self.counters.reject("find_rested")
            return None
        entry = self.book.entry(sender)
        # a request of too many keys costs what it is refused for; one of none still costs a request's handling
        entry.keys += max(1, min(keys, self.max_keys + 1))
        if keys > self.max_keys:
            self.counters.reject("find_too_many_keys")
            if entry.keys > self.budget_keys:
                self.book.start_rest(entry)
            return None
        if entry.keys > self.budget_keys or entry.nbytes >= self.budget_bytes:
            self.book.start_rest(entry)
            self.counters.reject("find_budget")
            return None
        room = self.budget_bytes - entry.nbytes
        window = self._hosts.bounded(host, self.host_budget_peers, by_host)
        if window is not None:
            window.count += max(1, keys)
            host_room = self.host_budget_peers * self.budget_bytes - window.nbytes
            if window.count > self.host_budget_peers * self.budget_keys or host_room <= 0:
                self.counters.reject("find_host_budget")
                return None
            room = min(room, host_room)
        return room

    def charge(self, sender: str, nbytes: int, host: str | None = None, by_host: bool = False) -> None:
        """Count ``nbytes`` value bytes of an answer to ``sender`` into its window, and with ``by_host`` into its
        ``host``'s."""
        self.book.entry(sender).nbytes += nbytes
        window = self._hosts.bounded(host, self.host_budget_peers, by_host)
        if window is not None:
            window.nbytes += nbytes

    def wrap(
        self,
        answer: Answer,
        refuse: Callable[[Any], Any],
        host_of: Callable[[Any], Awaitable[str | None]] | None = None,
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        """A find handler: a request :meth:`admit` refuses is answered ``refuse(request)`` (nothing looked up); any
        other ``answer(request, context, room)``, its value bytes charged to its sender and its host
        (``host_of(libp2p PeerID)``, :meth:`swarm.peer_hosts.PeerHosts.host`; None: no bound per host)."""

        async def gated_find(request: Any, context: Any) -> Any:
            sender = context.remote_id.to_base58()
            host, by_host = await sender_host(self.book, sender, context.remote_id, host_of)
            room = self.admit(sender, len(request.keys), host, by_host)
            if room is None:
                return refuse(request)
            response, nbytes = await answer(request, context, room)
            self.charge(sender, nbytes, host, by_host)
            return response

        return gated_find
