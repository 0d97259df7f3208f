"""Bounds what one libp2p peer's record requests make this node send: how many it may ask and how many answer bytes
it may take within a window, how often it may ask for the same record again, and what the peers of one host take
together; a peer beyond its budget rests.

A publisher answers a request for one of its records (:mod:`swarm.served`: about 80 bytes in, a record key) with the
whole record, signature included: usually tens of KiB, up to ``limits.max_record_bytes`` (3 MiB). The keys are public
(a publisher's index entry lists them), and hivemind starts a task for every incoming call with no cap, so a peer
asking the same record over and over had this node send 300-40,000 times what it was asked, as fast as the link
carried it: answers to a slow reader piled up in p2pd's memory and a full uplink delayed this node's own fetches,
stores and announcements. (500 requests for a record of 100 KB on loopback: 50 MB sent in 1.3 s.)

An honest reader fetches each record it chooses once (:mod:`swarm.fetcher`): a refill asks a publisher for at most
the records its index entry lists (``index_records``, 8) or announced since, each request answered or not. It asks a
record again only after a request failed (a timeout, a dropped connection: the publisher may have answered late) or
came back without it (a store still travelling), at most a few times (``_MISSING_TRIES``, 3), its host resting in
between (at least ``fetch_retry_after``, 1 s). :class:`ServeGate` counts per libp2p peer (the sender its transport
authenticated), over a window of ``window`` seconds (10):

- requests, at most ``budget_requests`` (:data:`SERVE_BUDGET_REQUESTS`), answered or not;
- answer bytes, at most ``budget_bytes`` (:data:`SERVE_BUDGET_BYTES`), a request whose answer would go beyond them
  refused before it is encoded;
- repeats: a record already answered to the peer in this window is answered again (a reader's retry after a failed
  fetch must work: answering it empty would read as "not served" and, after three tries, strike an honest publisher
  at that reader), its bytes counted as any answer's, but at most ``max_repeats`` (:data:`SERVE_REPEATS`) times a
  window; the repeat beyond rests the peer.

A request beyond any of these rests its peer (``served_senders_rested``; :mod:`swarm.rest_book`: 30 s, doubling up to
10 minutes) and is answered empty (``rejected/serve_budget`` or ``rejected/serve_repeat``), as are its requests while
it rests (``rejected/serve_rested``), with nothing looked up or encoded. An empty answer is what a reader reads as
"not served now" (hivemind would log a warning for each error raised instead). A libp2p identity costs a key, so
the peers of one host (:mod:`swarm.peer_hosts`) also share ``host_budget_peers`` peers' budgets (requests and bytes)
per window: beyond it their requests are answered empty (``rejected/serve_host_budget``) until the window ends, and
no peer rests for it, since honest readers behind one NAT share it (peers of this machine, on loopback, keep their
own budgets only), as the store gate's host budget does.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.protobuf.wrappers_pb2 import BytesValue

from swarm.rest_book import HostWindows, RestBook, SenderWindow
from swarm.transport import SwarmCounters

if TYPE_CHECKING:
    from swarm.served import ServedRecords

SERVE_BUDGET_REQUESTS = 128
"""Record requests one libp2p peer may make within a window (10 s). An honest reader asks a publisher for the records
it lists (8 by default) or announced since, once each, plus a few retries of those it did not get: a few dozen at most
when it first meets a publisher, usually one or two per window. A request costs this node a dictionary lookup."""

SERVE_BUDGET_BYTES = 32 * 2**20
"""Answer bytes one libp2p peer may take within a window (10 s). An honest reader fetches each record once: a reader
that meets this node fetches the records its index entry lists (8, usually tens of KiB each), then about one a training
step; 32 MiB holds ten records of the largest size (``limits.max_record_bytes``, 3 MiB), and hundreds of usual ones."""

SERVE_REPEATS = 8
"""Answers of a record already answered to the same peer within the window, per window. An honest reader asks again
only after a request failed (the answer lost, or late), at most three tries a record, its host resting at least 1 s in
between: a failed connection fails the few requests in flight on it at once. A peer asking one record over and over
is rested after this many."""

SERVE_WINDOW_SECONDS = 10.0
"""The window of the budgets above, in seconds."""

SERVE_HOST_PEERS = 4
"""Peers' budgets the libp2p peers of one host share per window (as ``store_budget_host_peers``, 4)."""


@dataclass
class _ServeWindow(SenderWindow):
    requests: int = 0
    nbytes: int = 0
    repeats: int = 0
    answered: set[int] = field(default_factory=set)  # hashes of the keys answered (at most budget_requests)

    def clear(self) -> None:
        """Count this peer's requests, answer bytes and repeats afresh."""
        self.requests, self.nbytes, self.repeats = 0, 0, 0
        self.answered = set()


class ServeGate:
    """Per-peer accounting of record requests, and the rest of a peer that asks beyond its budget.

    Parameters:
        counters: where ``rejected/serve_budget``, ``rejected/serve_repeat``, ``rejected/serve_rested``,
            ``rejected/serve_host_budget`` (requests answered empty) and ``served_senders_rested`` go.
        budget_requests: requests one peer may make within a window (:data:`SERVE_BUDGET_REQUESTS`).
        budget_bytes: answer bytes one peer may take within a window (:data:`SERVE_BUDGET_BYTES`).
        max_repeats: answers of records already answered to the peer, per window (:data:`SERVE_REPEATS`).
        host_budget_peers: the peers of one host together may take this many peers' budgets a window
            (:data:`SERVE_HOST_PEERS`; ``None``: no bound per host).
        window: seconds over which a peer's requests are counted.
        rest: a peer's first rest in seconds; each further rest doubles it (:mod:`swarm.rest_book`).
        max_senders: the most peers (and hosts) the gate holds.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        counters: SwarmCounters,
        budget_requests: int = SERVE_BUDGET_REQUESTS,
        budget_bytes: int = SERVE_BUDGET_BYTES,
        max_repeats: int = SERVE_REPEATS,
        host_budget_peers: int | None = SERVE_HOST_PEERS,
        window: float = SERVE_WINDOW_SECONDS,
        rest: float = 30.0,
        max_senders: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.counters = counters
        self.budget_requests = budget_requests
        self.budget_bytes = budget_bytes
        self.max_repeats = max_repeats
        self.host_budget_peers = host_budget_peers
        on_rest = lambda: counters.add("served_senders_rested")  # noqa: E731
        self.book = RestBook(_ServeWindow, window, rest, max_senders, on_rest, clock)
        self._hosts = HostWindows(window, max_senders, clock)  # what each host's peers' requests took

    def resting(self, sender: str) -> bool:
        """Whether ``sender``'s record requests are answered empty now."""
        return self.book.resting(sender)

    def admit(self, sender: str, key: bytes, nbytes: int | None, host: str | None = None) -> bool:
        """Count a request of ``sender`` (from ``host``; None: not known) for ``key``, whose answer would hold
        ``nbytes`` bytes (None: this node does not serve it, answered empty anyway): True when it may be answered
        (its bytes then counted), False when it is refused (counted by reason; the peer rests when it went beyond its
        budget)."""
        if self.book.resting(sender):
            self.counters.reject("serve_rested")
            return False
        entry = self.book.entry(sender)
        entry.requests += 1
        if entry.requests > self.budget_requests or entry.nbytes + (nbytes or 0) > self.budget_bytes:
            self.book.start_rest(entry)
            self.counters.reject("serve_budget")
            return False
        digest = hash(key)  # salted per process: a peer cannot aim collisions (and only its own window holds them)
        repeat = nbytes is not None and digest in entry.answered
        if repeat and entry.repeats >= self.max_repeats:
            self.book.start_rest(entry)
            self.counters.reject("serve_repeat")
            return False
        if not self.within_host_budget(host, nbytes or 0):
            self.counters.reject("serve_host_budget")
            return False
        if nbytes is not None:
            entry.repeats += repeat
            entry.answered.add(digest)
            entry.nbytes += nbytes
        return True

    def within_host_budget(self, host: str | None, nbytes: int) -> bool:
        """Count a request from ``host`` (None: not known, counted with the other unlisted peers; this machine's
        loopback: not counted) into its window; False when the window's requests or bytes would then exceed
        ``host_budget_peers`` peers' budgets. Nobody rests for it: the host's window refuses its peers' requests until
        it ends."""
        window = self._hosts.bounded(host, self.host_budget_peers)
        if window is None:
            return True
        window.count += 1
        over_requests = window.count > self.host_budget_peers * self.budget_requests
        if over_requests or window.nbytes + nbytes > self.host_budget_peers * self.budget_bytes:
            return False  # refused: its bytes are not sent, so not counted
        window.nbytes += nbytes
        return True

    def wrap(
        self, served: ServedRecords, host_of: Callable[[Any], Awaitable[str | None]] | None = None
    ) -> Callable[[BytesValue, Any], Awaitable[BytesValue]]:
        """The record handler of ``served`` behind this gate: a request :meth:`admit` refuses is answered empty,
        nothing encoded (a resting peer's, nothing looked up either); ``host_of(libp2p PeerID)`` names the host
        (:meth:`swarm.peer_hosts.PeerHosts.host`; None: no bound per host)."""

        async def gated_serve(request: BytesValue, context: Any) -> BytesValue:
            sender = context.remote_id.to_base58()
            if self.book.resting(sender):  # before the host is looked up: a resting peer costs a dictionary lookup
                self.counters.reject("serve_rested")
                return BytesValue()
            record = served.lookup(request.value)
            host = None if host_of is None else await host_of(context.remote_id)
            if not self.admit(sender, request.value, None if record is None else served.answer_bytes(record), host):
                return BytesValue()
            return served.answer(record)

        return gated_serve
