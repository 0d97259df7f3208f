"""The reading side of a DHT peer: read the index, choose unseen fresh records, fetch and validate them, cache groups.

:class:`SwarmReader` knows the swarm only through an object with hivemind's ``get_many(keys,
sufficient_expiration_time=None)`` (a :class:`~hivemind.dht.node.DHTNode`, or a dictionary-backed stand-in in unit
tests) and reads time from an injected :class:`~swarm.clock.Clock`, so expiry, clock skew and the choice of records
are tested without a p2pd daemon. A fetch costs O(J): only as many records are fetched as keep about
``prefetch_groups`` groups cached, and at most ``index_shards_per_poll`` index shards are read per poll.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import random
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.records import ReceivedGroup, RecordRef, RecordRejected, decode_index_entry, decode_record
from swarm.transport import PeerInfo, SwarmCounters, TimingLog
from swarm.validation import RejectionLog, fingerprint, index_keys, owner_marker, owner_public_key, record_key

logger = logging.getLogger("swarm.dht")

_RECORDS_PER_GET = 3  # hivemind packs sqrt(n) keys per lookup RPC: n <= 3 keeps one record per 4 MiB message
_RETURNED_IDS_KEPT = 100_000  # ids of groups handed out, so a record fetched twice is not trained on twice
_REJECTED_ENTRIES_KEPT = 10_000  # digests of refused index entries: one count per entry, not one per read
_MISSING_TRIES = 3  # polls a listed record may be missing (its store still travelling) before it is given up


class DHTLookup(Protocol):
    """The one DHT operation a reader needs: hivemind's :meth:`DHTNode.get_many`."""

    async def get_many(self, keys: list[str], sufficient_expiration_time: float | None = None) -> dict[str, Any]:
        """``{key: ValueWithExpiration or None}``; a dictionary value holds ``{subkey: ValueWithExpiration}``."""
        ...


@dataclass
class _PeerState:
    public_key: bytes
    model: str
    last_seen: float
    refs: list[RecordRef]


class SwarmReader:
    """Keeps a cache of other peers' fresh, validated groups filled; :meth:`take` hands them out once each.

    Thread-safe: :meth:`poll` runs on the transport's event loop, :meth:`take` and :meth:`peers` in any thread.

    Args:
        config: the transport's settings (intervals, ttl, cache sizes, limits).
        own_public_key: this peer's key; its own index entry is skipped.
        counters: where fetches and rejections are counted.
        timings: where lookup durations are recorded.
        clock: wall time dates records; monotonic time spaces index reads.
        rng: chooses among peers and shuffles what is handed out.
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        own_public_key: bytes,
        counters: SwarmCounters,
        timings: TimingLog,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ):
        self.config = config
        self._own_public_key = own_public_key
        self._label = fingerprint(own_public_key)  # this peer, in log lines
        self._counters = counters
        self._reject = RejectionLog(counters)
        self._timings = timings
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._peers: dict[str, _PeerState] = {}
        self._seen_refs: dict[tuple[str, int], float] = {}  # (sender, seq) -> created_at, pruned after the ttl
        self._missing_tries: collections.Counter[tuple[str, int]] = collections.Counter()
        self._cache: list[ReceivedGroup] = []
        self._returned: collections.OrderedDict[tuple[str, str, float], None] = collections.OrderedDict()
        self._skew_warned: set[str] = set()
        self._rejected_entries: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._last_index_read = -float("inf")
        self._shard_order = index_keys(config.swarm_name, config.index_shards)
        self._rng.shuffle(self._shard_order)  # peers start their rotation at different shards
        self._shard_cursor = 0

    # ------------------------------------------------------------------------------ any thread

    def take(self, max_groups: int) -> list[ReceivedGroup]:
        """Up to ``max_groups`` cached groups, in random order, never handed out before; never waits.

        Groups older than the record ttl are dropped (counted as ``rejected/expired``).
        """
        if max_groups <= 0:
            return []
        now = self._clock.time()
        with self._lock:
            fresh = []
            for item in self._cache:
                if now - item.group.created_at > self.config.record_ttl:
                    self._counters.reject("expired")
                else:
                    fresh.append(item)
            self._rng.shuffle(fresh)
            taken, self._cache = fresh[:max_groups], fresh[max_groups:]
            for item in taken:
                self._returned[_group_id(item)] = None
            while len(self._returned) > _RETURNED_IDS_KEPT:
                self._returned.popitem(last=False)
        self._counters.add("fetched_groups", len(taken))
        return taken

    def peers(self) -> list[PeerInfo]:
        """Other peers whose index entries were seen within the record ttl."""
        horizon = self._clock.time() - self.config.record_ttl
        with self._lock:
            return [
                PeerInfo(peer=peer, model=state.model, last_seen=state.last_seen)
                for peer, state in self._peers.items()
                if state.last_seen >= horizon
            ]

    def gauges(self) -> dict[str, float]:
        """Sizes of what the reader holds: cached groups, remembered refs, senders and handed-out ids."""
        with self._lock:
            return {
                "cached_groups": float(len(self._cache)),
                "seen_refs": float(len(self._seen_refs)),
                "known_senders": float(len(self._peers)),
                "returned_ids": float(len(self._returned)),
            }

    # ------------------------------------------------------------------------------ the event loop

    async def poll(self, dht: DHTLookup) -> None:
        """One background round: read the index when due, then fetch as many records as the cache lacks."""
        with self._lock:
            need = self.config.prefetch_groups - len(self._cache)
        since = self._clock.monotonic() - self._last_index_read
        if since >= self.config.index_refresh_interval or (need > 0 and since >= self.config.index_min_interval):
            self._last_index_read = self._clock.monotonic()
            self.forget_expired()
            await self.read_index(dht)
        if need > 0:
            await self.fetch_records(dht, self.choose_refs(need))

    def forget_expired(self) -> None:
        """Drop bookkeeping about records and peers older than the record ttl, so a long-running peer's memory
        stays bounded: expired refs are never chosen again, and a peer silent that long is not listed."""
        horizon = self._clock.time() - self.config.record_ttl - self.config.clock_skew_tolerance
        with self._lock:
            for ref in [ref for ref, created_at in self._seen_refs.items() if created_at < horizon]:
                del self._seen_refs[ref]
            for sender in [sender for sender, state in self._peers.items() if state.last_seen < horizon]:
                del self._peers[sender]

    async def read_index(self, dht: DHTLookup) -> None:
        """Read this poll's index shards (in rotation) and update what every other peer lists."""
        config = self.config
        started = self._clock.monotonic()
        count = config.index_shards_per_poll or config.index_shards
        if count >= config.index_shards:
            shard_keys = self._shard_order
        else:
            shard_keys = [self._shard_order[(self._shard_cursor + i) % config.index_shards] for i in range(count)]
            self._shard_cursor = (self._shard_cursor + count) % config.index_shards
        # A shard's expiration is that of its newest entry (written with now + ttl): asking for a copy updated
        # within index_staleness skips stale copies (our own cache included) without traversing every replica.
        sufficient = self._clock.time() + config.record_ttl - config.index_staleness
        results = await asyncio.wait_for(
            dht.get_many(shard_keys, sufficient_expiration_time=sufficient), config.fetch_timeout
        )
        self._counters.add("index_reads")
        self._timings.record("index", self._clock.monotonic() - started)
        now = self._clock.time()
        for found in results.values():
            if found is None or not isinstance(found.value, dict):
                continue
            for subkey, item in found.value.items():
                self._take_index_entry(subkey, item.value, now)

    def _take_index_entry(self, subkey: Any, value: Any, now: float) -> None:
        public_key = owner_public_key(subkey)
        if public_key is None or public_key == self._own_public_key:
            return
        sender = fingerprint(public_key)
        # The index is re-read every few seconds: an entry refused once is not judged (and counted) again.
        digest = hashlib.sha256(repr((subkey, value)).encode()).digest()
        if digest in self._rejected_entries:
            return
        try:
            entry = decode_index_entry(value, self.config.limits)
        except RecordRejected as e:
            self._remember_rejected(digest)
            self._reject(e.reason, f"index entry of {sender}: {e.detail}")
            return
        if entry.updated_at > now + self.config.clock_skew_tolerance:
            self._remember_rejected(digest)
            self._clock_skew(sender, entry.updated_at - now)
            return
        with self._lock:
            state = self._peers.get(sender)
            if state is None:
                logger.info("peer %s found peer %s (model %r)", self._label, sender, entry.model)
            if state is None or entry.updated_at >= state.last_seen:
                self._peers[sender] = _PeerState(public_key, entry.model, entry.updated_at, entry.records)

    def choose_refs(self, need: int) -> list[tuple[str, RecordRef]]:
        """Unseen fresh refs of other peers, newest first per peer, round-robin over peers in random order,
        until they promise ``need`` groups."""
        now = self._clock.time()
        oldest = now - self.config.record_ttl
        with self._lock:
            per_peer = {
                sender: sorted(
                    (
                        ref
                        for ref in state.refs
                        if (sender, ref.seq) not in self._seen_refs
                        and oldest <= ref.created_at <= now + self.config.clock_skew_tolerance
                    ),
                    key=lambda ref: -ref.created_at,
                )
                for sender, state in self._peers.items()
            }
        order = [sender for sender, refs in per_peer.items() if refs]
        self._rng.shuffle(order)
        chosen: list[tuple[str, RecordRef]] = []
        expected = 0
        while order and expected < need:
            for sender in list(order):
                ref = per_peer[sender].pop(0)
                chosen.append((sender, ref))
                expected += max(1, ref.num_groups)
                if not per_peer[sender]:
                    order.remove(sender)
                if expected >= need:
                    break
        return chosen

    async def fetch_records(self, dht: DHTLookup, chosen: list[tuple[str, RecordRef]]) -> None:
        """Look up the ``chosen`` records (a few keys per lookup) and cache their valid groups."""
        if not chosen:
            return
        config = self.config
        started = self._clock.monotonic()
        keys = {record_key(config.swarm_name, sender, ref.seq): (sender, ref) for sender, ref in chosen}
        chunks = [list(keys)[i : i + _RECORDS_PER_GET] for i in range(0, len(keys), _RECORDS_PER_GET)]
        outcomes = await asyncio.gather(
            *(asyncio.wait_for(dht.get_many(chunk), config.fetch_timeout) for chunk in chunks),
            return_exceptions=True,
        )
        results: dict[str, Any] = {}
        for chunk, outcome in zip(chunks, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self._counters.add("fetch_failures")
                logger.debug("peer %s: record lookup failed: %r", self._label, outcome)
                outcome = dict.fromkeys(chunk)
            results.update(outcome)
        self._timings.record("fetch", self._clock.monotonic() - started)
        for key, found in results.items():
            sender, ref = keys[key]
            self._take_record(sender, ref, found)

    def _take_record(self, sender: str, ref: RecordRef, found: Any) -> None:
        config = self.config
        with self._lock:
            state = self._peers.get(sender)
        if state is None:
            return
        if found is None or not isinstance(found.value, dict):
            # Not there yet (store still travelling) or lost: retry a few polls, then give up on it.
            self._missing_tries[(sender, ref.seq)] += 1
            if self._missing_tries[(sender, ref.seq)] >= _MISSING_TRIES:
                del self._missing_tries[(sender, ref.seq)]
                self._seen_refs[(sender, ref.seq)] = ref.created_at
                self._counters.add("records_missing")
            return
        self._seen_refs[(sender, ref.seq)] = ref.created_at
        self._missing_tries.pop((sender, ref.seq), None)
        expected_subkey = owner_marker(state.public_key)
        value = None
        for subkey, item in found.value.items():
            if subkey == expected_subkey:
                value = item.value
            else:  # someone else wrote under this peer's records key: signed, but not by the owner
                self._reject("bad_signature", f"foreign subkey under the records key of {sender}")
        if value is None:
            self._counters.add("records_missing")
            return
        self._counters.add("fetched_bytes", len(value) if isinstance(value, bytes) else 0)
        try:
            record = decode_record(value, config.limits)
        except RecordRejected as e:
            self._reject(e.reason, f"record of {sender}: {e.detail}")
            return
        now = self._clock.time()
        if record.created_at > now + config.clock_skew_tolerance:
            self._clock_skew(sender, record.created_at - now)
            return
        self._counters.add("fetched_records")
        accepted = []
        for group in record.groups:
            if group.created_at > now + config.clock_skew_tolerance:
                self._clock_skew(sender, group.created_at - now)
            elif now - group.created_at > config.record_ttl:
                self._reject("expired", f"group of {sender} is {now - group.created_at:.0f} s old")
            else:
                accepted.append(ReceivedGroup(sender=sender, group=group))
        if accepted:
            # Delivery latency: from the sender's publication (its record's date) to the groups being ready here.
            self._timings.record("delivery", max(0.0, now - record.created_at))
        with self._lock:
            for item in accepted:
                if _group_id(item) not in self._returned:
                    self._cache.append(item)
            if len(self._cache) > config.max_cached_groups:
                self._cache.sort(key=lambda item: item.group.created_at)
                del self._cache[: len(self._cache) - config.max_cached_groups]
        self._counters.add("received_groups", len(accepted))

    def _remember_rejected(self, digest: bytes) -> None:
        self._rejected_entries[digest] = None
        while len(self._rejected_entries) > _REJECTED_ENTRIES_KEPT:
            self._rejected_entries.popitem(last=False)

    def _clock_skew(self, sender: str, ahead: float) -> None:
        self._reject("clock_skew", f"peer {sender} is {ahead:.1f} s in the future")
        if sender not in self._skew_warned:
            self._skew_warned.add(sender)
            logger.warning(
                "peer %s: records of peer %s are dated %.1f s in the future: the clocks of the two machines "
                "differ (hivemind peers whose clocks differ by more than 3 s fail to interact); sync them (NTP)",
                self._label,
                sender,
                ahead,
            )


def _group_id(item: ReceivedGroup) -> tuple[str, str, float]:
    return item.sender, item.group.group_id, item.group.created_at
