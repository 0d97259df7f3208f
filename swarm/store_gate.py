"""Bounds what one transport peer's store requests make this node verify and keep: a peer whose stores are mostly
refused, or that asks this node to keep more than its budget, rests.

hivemind's DHT answers a store request by validating every value in it (decoding, an RSA signature check): about
0.1-0.3 ms of this node's CPU a value, and a request may hold many values. An honest peer stores its own signed
records and the ones it looked up (checked by its own validators), so its values are refused rarely; a peer that
sends forged or oversized values by the thousand makes this node spend on each. :class:`StoreGate` sits in front of
the store handler: it counts, per libp2p peer (the sender the transport authenticated, which a forger cannot choose,
unlike the ``[owner:...]`` key a value claims), the values its requests held and those the validators refused. A peer
with at least ``min_refused`` refusals in a window of ``window`` seconds, at least half of its values, rests: its
store requests are then answered "not stored" without a value being decoded or verified (counted as
``rejected/sender_rested``), for ``rest`` seconds, doubling on each rest up to :data:`MAX_REST_SECONDS`. The book
holds at most ``max_senders`` peers (the oldest not resting leave first), so fresh libp2p identities cannot grow it.

Valid values cost memory rather than refusals: each is kept until it expires (the record ttl plus the clock
tolerance, about 11 minutes), so a peer storing well-signed records under fresh keys would make this node hold what
its bandwidth carries. A peer is therefore also given a budget per window: at most ``budget_bytes`` value bytes and
``budget_values`` values, counted as a request arrives (before anything is decoded), whether its values are then
stored or refused. A request that would take the window beyond either rests its sender at once, the request refused
unverified (its values counted as ``rejected/store_budget``), with the same rests as above. The budget bounds what one
libp2p identity makes this node keep, not what many do, and identities cost a key each. So the peers of one host (the
address their connections come from, :mod:`swarm.peer_hosts`) also share a budget of ``host_budget_peers`` senders'
budgets per window: a request beyond it is refused unverified (``rejected/store_host_budget``) until the window ends,
and no peer rests for it, since honest peers behind one NAT share it with whoever else is there (peers of this machine,
on loopback, keep their own budgets only). The DHT's storage
itself is bounded in bytes, what goes counted by host first (:func:`swarm.hivemind_bridge.bound_storage`).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from swarm.rest_book import MAX_REST_SECONDS, UNLISTED, HostWindows, RestBook, SenderWindow
from swarm.transport import SwarmCounters

__all__ = ["MAX_REST_SECONDS", "STORE_REQUEST", "UNLISTED", "StoreGate", "StoreRequest", "current_storer"]


@dataclass
class StoreRequest:
    """The store request being validated: its sender (the libp2p id, base58), the sender's host
    (:mod:`swarm.peer_hosts`; None: not known) and the values the validators refused so far
    (:meth:`StoreGate.refused`). They are counted into the sender's window with the request's values once it ends, so
    that a request's refusals and values land in one window even when the window ends while it is validated."""

    sender: str
    host: str | None = None
    refused: int = 0


STORE_REQUEST: contextvars.ContextVar[StoreRequest | None] = contextvars.ContextVar("store_request", default=None)
"""The :class:`StoreRequest` being validated, while it is."""


def current_storer() -> tuple[str | None, str] | None:
    """``(host, libp2p id)`` of the peer whose store request is being handled (the host None when not known), or None
    outside one: whom :class:`swarm.hivemind_bridge.BoundedStorage` counts a stored value to."""
    request = STORE_REQUEST.get()
    return None if request is None else (request.host, request.sender)


@dataclass
class _StoreWindow(SenderWindow):
    values: int = 0
    refused: int = 0
    offered_values: int = 0  # values and bytes its requests held, counted as they arrive (the budget's)
    offered_bytes: int = 0

    def clear(self) -> None:
        """Count this sender's values, refusals and budget afresh."""
        self.values, self.refused, self.offered_values, self.offered_bytes = 0, 0, 0, 0


class StoreGate:
    """Per-sender accounting of store requests, and the rest of a sender whose values are mostly refused or over its
    budget.

    Parameters:
        counters: where ``rejected/sender_rested`` (values refused unverified), ``rejected/store_budget`` (the values
            of a request that went over its sender's budget) and ``store_senders_rested`` go.
        min_refused: refusals within one window that can start a rest (if they are at least half of its values).
        window: seconds over which a sender's values, refusals and budget are counted.
        rest: a sender's first rest in seconds; each further rest doubles it, up to :data:`MAX_REST_SECONDS`.
        max_senders: the most senders the book holds.
        budget_bytes: value bytes one sender's requests may hold within a window (``None``: no limit).
        budget_values: values one sender's requests may hold within a window (``None``: no limit).
        host_budget_peers: the peers of one host (:mod:`swarm.peer_hosts`) together may hold within a window this
            many senders' budgets (``None``: no bound per host); a request beyond it is refused unverified
            (``rejected/store_host_budget``), and its sender does not rest for it (it may be an honest peer behind
            the same NAT as a hoarder).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        counters: SwarmCounters,
        min_refused: int = 32,
        window: float = 10.0,
        rest: float = 30.0,
        max_senders: int = 4096,
        budget_bytes: int | None = None,
        budget_values: int | None = None,
        host_budget_peers: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.counters = counters
        self.min_refused = min_refused
        self.budget_bytes = budget_bytes
        self.budget_values = budget_values
        self.host_budget_peers = host_budget_peers
        self._book = RestBook(
            _StoreWindow, window, rest, max_senders, lambda: counters.add("store_senders_rested"), clock
        )
        self._hosts = HostWindows(window, max_senders, clock)  # what each host's peers' requests held

    def __len__(self) -> int:
        """How many senders the book holds."""
        return len(self._book)

    @property
    def rest(self) -> float:
        """A sender's first rest in seconds (settable)."""
        return self._book.rest

    @rest.setter
    def rest(self, seconds: float) -> None:
        self._book.rest = seconds

    def resting(self, sender: str) -> bool:
        """Whether ``sender``'s store requests are refused unverified now."""
        return self._book.resting(sender)

    def refused(self) -> None:
        """Count one value refused by a validator against the store request being validated (none outside a store
        request: a lookup's answers are this node's own request)."""
        request = STORE_REQUEST.get()
        if request is not None:
            request.refused += 1

    def wrap(
        self,
        rpc_store: Callable[[Any, Any], Awaitable[Any]],
        refuse_all: Callable[[Any], Any],
        host_of: Callable[[Any], Awaitable[str | None]] | None = None,
    ) -> Any:
        """A store handler around ``rpc_store(request, context)``: a resting sender's request, or one that would take
        its sender over its budget (:meth:`within_budget`) or its host's peers over theirs (:meth:`within_host_budget`;
        ``host_of(libp2p PeerID)`` names the host, :meth:`swarm.peer_hosts.PeerHosts.host`; None: no host known), is
        answered ``refuse_all(request)`` (nothing decoded or verified); any other is validated with
        :data:`STORE_REQUEST` (sender and host) set, then judged (:meth:`judge`)."""

        async def gated_store(request: Any, context: Any) -> Any:
            sender = context.remote_id.to_base58()
            values = len(request.keys)
            if self.resting(sender):
                self.counters.reject("sender_rested", values)
                return refuse_all(request)
            nbytes = sum(len(value) for value in request.values)
            if not self.within_budget(sender, values, nbytes):
                self.counters.reject("store_budget", values)
                return refuse_all(request)
            host = None if host_of is None else await host_of(context.remote_id)
            if not self.within_host_budget(host, values, nbytes):
                self.counters.reject("store_host_budget", values)
                return refuse_all(request)
            validated = StoreRequest(sender, host)
            token = STORE_REQUEST.set(validated)
            try:
                return await rpc_store(request, context)
            finally:
                STORE_REQUEST.reset(token)
                self.judge(sender, values, validated.refused)

        return gated_store

    def judge(self, sender: str, values: int, refused: int) -> None:
        """After one of ``sender``'s store requests (``values`` values, ``refused`` of them refused): count them into
        its window, and start a rest when the window's refusals reach ``min_refused`` and half of its values."""
        entry = self._book.entry(sender)
        entry.values += values
        entry.refused += refused
        if entry.refused >= self.min_refused and 2 * entry.refused >= entry.values:
            self._book.start_rest(entry)

    def within_budget(self, sender: str, values: int, nbytes: int) -> bool:
        """Count a store request of ``sender`` (``values`` values, ``nbytes`` value bytes) into its window's budget as
        it arrives; False, and the sender rests, when the window's values or bytes would then exceed the budget."""
        entry = self._book.entry(sender)
        entry.offered_values += values
        entry.offered_bytes += nbytes
        over_values = self.budget_values is not None and entry.offered_values > self.budget_values
        over_bytes = self.budget_bytes is not None and entry.offered_bytes > self.budget_bytes
        if over_values or over_bytes:
            self._book.start_rest(entry)
            return False
        return True

    def within_host_budget(self, host: str | None, values: int, nbytes: int) -> bool:
        """Count a store request from ``host`` (None: not known, counted as one host :data:`UNLISTED` together; this
        machine's loopback: not counted) into its window as it arrives; False when the window's values or bytes would
        then exceed ``host_budget_peers`` senders' budgets. Nobody rests for it: the host's window refuses its peers'
        requests until it ends."""
        window = self._hosts.bounded(host, self.host_budget_peers)
        if window is None:
            return True
        window.count += values
        window.nbytes += nbytes
        over_values = self.budget_values is not None and window.count > self.host_budget_peers * self.budget_values
        over_bytes = self.budget_bytes is not None and window.nbytes > self.host_budget_peers * self.budget_bytes
        return not (over_values or over_bytes)
