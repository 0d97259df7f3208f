"""Fetching chosen records: from the peers that serve them, hedged across a second publisher after an RTT-based
timeout, or by DHT lookups; every record passes the reading peer's validator and its announced digest.

A served record is one request and one answer. Its time is tracked as TCP tracks a round trip (a smoothed mean and
mean deviation, :class:`RoundTrip`); a request not answered within the mean plus four deviations (at least
``_HEDGE_FLOOR`` s, at most ``wait_timeout``) is *hedged*: a record of another publisher is requested too, and
whatever arrives is kept. A slow or departed publisher then costs a reader one round trip's margin, not
``wait_timeout``, and at most one extra record when it was merely slow. A fetch round waits for its requests at most
two hedge times (the hedge's own request gets one); a request still running then (a publisher that never answers,
which its ``wait_timeout`` ends, or a DHT lookup of a record stored by a client-mode peer, which may take up to
``fetch_timeout``) finishes in the background, its record not chosen again meanwhile, so that neither holds up the next
refill: a publisher that takes requests and never answers them, announcing a fresh record before every refill, used to
hold every round (and the poller) for ``wait_timeout``. Only the answers of senders judged good move the round-trip
time once one of them has answered: a stranger's valid but slow answers would otherwise lengthen every round's wait.

What a fetch says of a record's sender goes to the reader's book (:mod:`swarm.senders`): an answer that is refused
(malformed, not signed by the sender, not the record announced) is a strike of its sender at once; a record its host
answered without, or no DHT replica held, is retried a few times and then a strike (never served); a host that does
not answer at all rests, and its sender is not blamed (the network, or a peer that left).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from swarm.announcements import record_digest
from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.records import RecordRef, RecordRejected
from swarm.sender_state import Choice
from swarm.senders import SenderBook
from swarm.served import ServedLookup, SignedRecord
from swarm.transport import SwarmCounters, TimingLog
from swarm.validation import RejectionLog, owner_marker, record_key

logger = logging.getLogger(__name__)

_RECORDS_PER_GET = 3  # hivemind packs sqrt(n) keys per lookup RPC: n <= 3 keeps one record per 4 MiB message
_HEDGE_FLOOR = 0.25  # seconds: the least wait before a hedge, however fast the round trips were


class DHTLookup(Protocol):
    """The one DHT operation a reader needs: hivemind's :meth:`DHTNode.get_many`."""

    async def get_many(
        self,
        keys: list[str],
        sufficient_expiration_time: float | None = None,
        num_workers: int | None = None,
        beam_size: int | None = None,
    ) -> dict[str, Any]:
        """``{key: ValueWithExpiration or None}``; a dictionary value holds ``{subkey: ValueWithExpiration}``;
        ``num_workers`` find RPCs in flight at once, ``beam_size`` nodes kept asking (None: the node's defaults)."""
        ...


class RoundTrip:
    """A smoothed round-trip time and its mean deviation (RFC 6298's estimator), in seconds."""

    def __init__(self) -> None:
        self.mean: float | None = None
        self.deviation = 0.0

    def add(self, seconds: float) -> None:
        """One measured round trip."""
        if self.mean is None:
            self.mean, self.deviation = seconds, seconds / 2
        else:
            self.deviation = 0.75 * self.deviation + 0.25 * abs(self.mean - seconds)
            self.mean = 0.875 * self.mean + 0.125 * seconds

    def timeout(self, floor: float, ceiling: float) -> float:
        """The mean plus four deviations within ``[floor, ceiling]``; ``ceiling`` before the first round trip."""
        if self.mean is None:
            return ceiling
        return min(max(self.mean + 4 * self.deviation, floor), ceiling)


class ReasonedRejections(RejectionLog):
    """A :class:`~swarm.validation.RejectionLog` that also remembers, per thread, the reason of the latest rejection it
    counted: a validator answers yes or no, and a served record it refused strikes its sender with the reason.
    ``on_refusal`` is called at each rejection too (:meth:`swarm.store_gate.StoreGate.refused`)."""

    def __init__(self, counters: SwarmCounters, interval: float = 10.0, on_refusal: Callable[[], None] | None = None):
        super().__init__(counters, interval)
        self._latest = threading.local()
        self._on_refusal = on_refusal

    def __call__(self, reason: str, detail: str) -> None:
        """Count one rejection (see :class:`~swarm.validation.RejectionLog`) and remember its reason."""
        self._latest.reason = reason
        super().__call__(reason, detail)
        if self._on_refusal is not None:
            self._on_refusal()

    def take_reason(self) -> str | None:
        """The reason of the latest rejection counted in this thread since the last call, if any."""
        reason, self._latest.reason = getattr(self._latest, "reason", None), None
        return reason


class RecordFetcher:
    """Fetches chosen records and hands each valid one's bytes to ``on_record``.

    Args:
        config: timeouts, limits and DHT lookup settings.
        book: the senders' public keys and digests; where records are marked fetched or missing and hosts rest.
        served: fetches served records and checks them; ``None``: every record is looked up in the DHT.
        counters: where fetch failures, hedges and rejections are counted.
        timings: where each fetch round's duration (``fetch``) and each served request's (``served_fetch``) go.
        clock: monotonic time measures durations.
        on_record: called with ``(sender, ref, record bytes)`` for every record that passed the checks (the reader
            decodes it, and strikes its sender if it refuses it).
        validator_rejections: where the validator that opens served records counts its refusals, if it remembers
            their reasons (:class:`ReasonedRejections`); a refused record's strike then carries the reason, else
            ``invalid_record``.
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        book: SenderBook,
        served: ServedLookup | None,
        counters: SwarmCounters,
        timings: TimingLog,
        clock: Clock = SYSTEM_CLOCK,
        on_record: Callable[[str, RecordRef, bytes], None] = lambda sender, ref, value: None,
        validator_rejections: ReasonedRejections | None = None,
    ):
        self.config = config
        self.round_trip = RoundTrip()
        self._book = book
        self._served = served
        self._counters = counters
        self._reject = RejectionLog(counters)
        self._timings = timings
        self._clock = clock
        self._on_record = on_record
        self._validator_rejections = validator_rejections
        self._timed_by_good = False  # a sender judged good answered: only such senders' answers time round trips now
        self._background: set[asyncio.Task] = set()  # requests a round left running (kept referenced until done)

    def hedge_after(self) -> float:
        """Seconds a served request waits before it is hedged (see the module docstring)."""
        return self.round_trip.timeout(_HEDGE_FLOOR, self.config.wait_timeout)

    async def fetch(self, dht: DHTLookup, chosen: list[Choice], spares: list[Choice] = ()) -> None:
        """Fetch the ``chosen`` records (served ones hedged with ``spares``, the rest by DHT lookups)."""
        if not chosen:
            return
        started = self._clock.monotonic()
        use_served = self._served is not None
        served = [choice for choice in chosen if choice.host and use_served]
        in_dht = [choice for choice in chosen if not (choice.host and use_served)]
        spare = [choice for choice in spares if choice.host and use_served]
        work = [self._fetch_from_dht(dht, in_dht), *(self._hedged(choice, spare) for choice in served)]
        tasks = [asyncio.ensure_future(job) for job in work]
        hedge = self.hedge_after()
        _, running = await asyncio.wait(tasks, timeout=min(2 * hedge, hedge + self.config.wait_timeout))
        if running:
            self._counters.add("fetches_left_running", len(running))
            self._background.update(running)
            for task in running:
                task.add_done_callback(self._background.discard)
        self._timings.record("fetch", self._clock.monotonic() - started)

    def _time(self, sender: str, seconds: float) -> None:
        """Time one answered request of ``sender``: it moves the round-trip time if ``sender`` is judged good, or if no
        sender judged good has answered yet."""
        good = self._book.standing(sender) == "good"
        if good or not self._timed_by_good:
            self.round_trip.add(seconds)
        self._timed_by_good |= good
        self._timings.record("served_fetch", seconds)

    async def _hedged(self, choice: Choice, spares: list[Choice]) -> None:
        """Request ``choice``; if it is not answered within :meth:`hedge_after`, request a spare too."""
        first = asyncio.ensure_future(self._fetch_served(choice))
        done, _ = await asyncio.wait({first}, timeout=self.hedge_after())
        if done or not spares:
            await first
            return
        self._counters.add("hedged_fetches")
        second = asyncio.ensure_future(self._fetch_served(spares.pop(0)))
        await asyncio.gather(first, second)

    async def _fetch_served(self, choice: Choice) -> bool:
        """Fetch one served record; True if it arrived and passed the checks."""
        self._book.fetching(choice, True)
        try:
            return await self._fetch_served_now(choice)
        finally:
            self._book.fetching(choice, False)

    async def _fetch_served_now(self, choice: Choice) -> bool:
        assert self._served is not None and choice.host is not None
        sender, ref, host = choice.sender, choice.ref, choice.host
        key = record_key(self.config.swarm_name, sender, ref.seq)
        started = self._clock.monotonic()
        try:
            # One request and one answer: hivemind's time for one RPC answer, not a lookup's fetch_timeout.
            record: SignedRecord | None = await asyncio.wait_for(
                self._served.get_served(host, key), self.config.wait_timeout
            )
        except RecordRejected as e:
            self._book.mark_fetched(sender, ref, host)  # a malformed answer is not asked for again
            self._reject(e.reason, f"record of {sender} served by {host}: {e.detail}")
            self._book.strike(sender, e.reason)
            return False
        except Exception as e:  # the publisher left or is unreachable: its host rests, then is retried a few times
            self._counters.add("fetch_failures")
            self._book.rest(host, sender)
            self._book.record_missing(sender, ref, unreachable=True)
            logger.debug("fetching a record from %s failed: %r", host, e)
            return False
        self._time(sender, self._clock.monotonic() - started)
        public_key = self._book.public_key(sender)
        if public_key is None:  # forgotten meanwhile (evicted from a full book)
            return False
        if record is None:  # its host answered without it: retried, then a strike (announced, never served)
            self._book.record_missing(sender, ref)
            return False
        self._book.mark_fetched(sender, ref, host)
        rejections = self._validator_rejections
        if rejections is not None:
            rejections.take_reason()
        value = self._served.open(key, owner_marker(public_key), record)
        if value is None:  # the validator refused it and counted why
            reason = rejections.take_reason() if rejections is not None else None
            self._book.strike(sender, reason or "invalid_record")
            return False
        return self._checked(choice, value)

    def _checked(self, choice: Choice, value: bytes) -> bool:
        """Hand ``value`` on if it matches the digest and size its sender announced (when it announced them): the
        size scheduled the refill (:func:`swarm.refill.weight`)."""
        sender, ref, announced = choice.sender, choice.ref, choice.announced
        if isinstance(value, bytes):  # what it truly weighs is spent, refused or not
            self._book.fetched_size(sender, ref, len(value))
        if announced is not None and not (
            isinstance(value, bytes) and len(value) == announced[1] and record_digest(value) == announced[0]
        ):
            self._reject("digest_mismatch", f"record {ref.seq} of {sender} is not the one it announced")
            self._book.strike(sender, "digest_mismatch")
            return False
        self._on_record(sender, ref, value)
        return True

    async def _fetch_from_dht(self, dht: DHTLookup, chosen: list[Choice]) -> None:
        for choice in chosen:
            self._book.fetching(choice, True)
        try:
            await self._fetch_from_dht_now(dht, chosen)
        finally:
            for choice in chosen:
                self._book.fetching(choice, False)

    async def _fetch_from_dht_now(self, dht: DHTLookup, chosen: list[Choice]) -> None:
        if not chosen:
            return
        config = self.config
        keys = {record_key(config.swarm_name, c.sender, c.ref.seq): c for c in chosen}
        chunks = [list(keys)[i : i + _RECORDS_PER_GET] for i in range(0, len(keys), _RECORDS_PER_GET)]
        outcomes = await asyncio.gather(
            *(
                asyncio.wait_for(
                    dht.get_many(chunk, num_workers=config.dht_record_lookup_workers, beam_size=config.dht_lookup_beam),
                    config.fetch_timeout,
                )
                for chunk in chunks
            ),
            return_exceptions=True,
        )
        results: dict[str, Any] = {}
        for chunk, outcome in zip(chunks, outcomes, strict=True):
            if isinstance(outcome, BaseException):  # the lookup itself failed: the network, not the sender
                self._counters.add("fetch_failures")
                logger.debug("record lookup failed: %r", outcome)
                for key in chunk:
                    self._book.record_missing(keys[key].sender, keys[key].ref, unreachable=True)
                continue
            results.update(outcome)
        for key, found in results.items():
            self._take_found(keys[key], found)

    def _take_found(self, choice: Choice, found: Any) -> None:
        """Take what a DHT lookup of one record returned."""
        sender, ref = choice.sender, choice.ref
        public_key = self._book.public_key(sender)
        if public_key is None:
            return
        if found is None or not isinstance(found.value, dict):
            self._book.record_missing(sender, ref)
            return
        self._book.mark_fetched(sender, ref)
        expected_subkey = owner_marker(public_key)
        value = None
        for subkey, item in found.value.items():
            if subkey == expected_subkey:
                value = item.value
            else:  # someone else wrote under this peer's records key: signed, but not by the owner
                self._reject("bad_signature", f"foreign subkey under the records key of {sender}")
        if value is None:
            self._counters.add("records_missing")
            return
        self._checked(choice, value)
