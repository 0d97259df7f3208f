"""The reading side of a DHT peer: read the index, choose unseen fresh records, fetch and validate them, cache groups.

:class:`SwarmReader` knows the swarm only through an object with hivemind's ``get_many(keys,
sufficient_expiration_time=None)`` (a :class:`~hivemind.dht.node.DHTNode`, or a dictionary-backed stand-in in unit
tests) and reads time from an injected :class:`~swarm.clock.Clock`, so expiry, clock skew and the choice of records
are tested without a p2pd daemon.

What a reader costs per step does not grow with the swarm's size N:

- records: only as many are fetched as keep about ``prefetch_groups`` groups cached (O(J));
- index: a read returns about ``index_shards_per_poll * index_shard_entries`` entries at any N (more shards of
  level 0 are read while the swarm is too small to fill them: :func:`shards_per_read`). The index has
  levels (:func:`swarm.validation.index_keys`): level ``l`` lists the peers over ``index_shards * 2**l`` shards.
  The reader estimates N from its last few reads (the mean of each read's entries over the share of its level's
  shards it read) and reads, in rotation, the level whose shards hold about ``index_shard_entries`` entries; its
  peer's publisher writes to the levels :meth:`SwarmReader.write_levels`: from one below the level it reads to
  two above the last one whose shards still hold an entry, so a reader whose estimate is from half to twice
  as high (four times with ``index_shard_entries`` 2) still finds it. Not writing the low levels is what keeps a
  store's cost flat: hivemind's store first looks the key up, and every replica on the way answers with the
  whole shard, which at level 0 lists N / ``index_shards`` peers. A reader's first read probes two shards of the
  middle level, which costs a few entries at N = 8 and at N = 10^4 alike; a read that finds no entry (a first
  probe, or a reader whose estimate fell below the writers' levels) is followed by probes of level 0 and of
  every third level (:func:`probe_levels`) until one finds entries, which then start the estimate afresh. A
  publisher without an estimate writes every level.
- when: the index is read when the cache needs groups (at most every ``index_min_interval``), or every
  ``index_refresh_interval`` to keep :meth:`SwarmReader.peers` current; a read while the cache is full fetches
  nothing, so it buys no freshness. The peers listed by the latest read are chosen first (their newest refs are
  the freshest), and the rotation over shards spreads the choice over all senders.

At large N, :meth:`SwarmReader.peers` is therefore the sample of peers the reader's reads listed within the record
ttl, not the whole swarm.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import math
import random
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.records import ReceivedGroup, RecordRef, RecordRejected, decode_index_entry, decode_record
from swarm.served import ServedLookup, SignedRecord
from swarm.transport import PeerInfo, SwarmCounters, TimingLog
from swarm.validation import RejectionLog, fingerprint, index_keys, owner_marker, owner_public_key, record_key

logger = logging.getLogger(__name__)

_RECORDS_PER_GET = 3  # hivemind packs sqrt(n) keys per lookup RPC: n <= 3 keeps one record per 4 MiB message
_RETURNED_IDS_KEPT = 100_000  # ids of groups handed out, so a record fetched twice is not trained on twice
_REJECTED_ENTRIES_KEPT = 10_000  # digests of refused index entries: one count per entry, not one per read
_MISSING_TRIES = 3  # polls a listed record may be missing (its store still travelling) before it is given up
_UNREACHABLE_SECONDS = 30.0  # a publisher whose served record could not be fetched is not asked again this long
_ESTIMATE_READS = 8  # index reads pooled into the estimate of the swarm's size
_WRITE_LEVELS_ABOVE = 2  # levels written above the last whose shards hold an entry: readers estimating 2x more
_WRITE_LEVELS_BELOW = 1  # levels written below the read level: readers estimating half as many peers
_EMPTY_READS_BEFORE_PROBING = 2  # with an estimate: two reads of ~4 entries both empty is chance 1 in ~3000, not one


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


@dataclass
class _PeerState:
    public_key: bytes
    model: str
    last_seen: float
    refs: list[RecordRef]
    listed_by: int  # number of the latest index read that listed this peer
    host: str | None = None  # the libp2p id serving its records (swarm.served); None: they are in the DHT


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
        served: fetches the records of peers that serve their own (their index entry names a host) and checks
            them; ``None``: every record is looked up in the DHT.
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        own_public_key: bytes,
        counters: SwarmCounters,
        timings: TimingLog,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        served: ServedLookup | None = None,
    ):
        self.config = config
        self._served = served
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
        # host -> (monotonic time it may be asked again, wall time of the failure): see _resting_hosts
        self._unreachable: dict[str, tuple[float, float]] = {}
        self._cache: list[ReceivedGroup] = []
        self._returned: collections.OrderedDict[tuple[str, str, float], None] = collections.OrderedDict()
        self._skew_warned: set[str] = set()
        self._rejected_entries: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._last_index_read = -float("inf")
        self._index_reads = 0
        self._rotation = self._rng.randrange(1 << 30)  # peers start their rotation at different shards
        self._recent_estimates: collections.deque[float] = collections.deque(maxlen=_ESTIMATE_READS)
        self._empty_reads = 0  # index reads in a row that found no entry: the next ones probe (probe_levels)

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

    def cached_groups(self) -> int:
        """Groups held for :meth:`take` (some may expire before they are taken)."""
        with self._lock:
            return len(self._cache)

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
        """Sizes of what the reader holds (cached groups, remembered refs, senders and handed-out ids), its estimate
        of the swarm's size (-1 before the first index read) and the index level it reads."""
        estimate, level = self.estimated_peers(), self.read_level()
        with self._lock:
            return {
                "cached_groups": float(len(self._cache)),
                "seen_refs": float(len(self._seen_refs)),
                "known_senders": float(len(self._peers)),
                "returned_ids": float(len(self._returned)),
                "estimated_peers": -1.0 if estimate is None else estimate,
                "index_level": float(level),
            }

    def estimated_peers(self) -> float | None:
        """The number of peers listed in the index, estimated from the last few index reads (the mean over them of
        the entries a read found over the share of its level's shards it read); ``None`` before the first read."""
        with self._lock:
            if not self._recent_estimates:
                return None
            return sum(self._recent_estimates) / len(self._recent_estimates)

    def read_level(self) -> int:
        """The index level the next read reads: the one whose shards hold about ``index_shard_entries`` entries by
        :meth:`estimated_peers`; the middle level before the first read (a cheap probe at any N); after reads that
        found nothing, the next of :func:`probe_levels`; level 0 when ``index_shards_per_poll`` is 0 (the whole
        index every time)."""
        probe = self._probe_level()
        return probe if probe is not None else read_level_for(self.estimated_peers(), self.config)

    def _probe_level(self) -> int | None:
        """The level the next read probes after reads that found nothing (:func:`probe_levels` in turn); ``None``
        while reads find entries."""
        probing_after = 1 if self.estimated_peers() is None else _EMPTY_READS_BEFORE_PROBING
        if self._empty_reads >= probing_after and self.config.index_shards_per_poll:
            probes = probe_levels(self.config)
            return probes[self._empty_reads % len(probes)]
        return None

    def write_levels(self) -> range:
        """The index levels this peer's publisher writes its entry to (:func:`write_levels_for` of
        :meth:`estimated_peers`): a few levels around the one readers of this swarm size read, every level before
        the first read."""
        return write_levels_for(self.estimated_peers(), self.config)

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
        """Read this poll's index shards (in rotation, at :meth:`read_level`) and update what other peers list."""
        config = self.config
        started = self._clock.monotonic()
        estimate = self.estimated_peers()
        usual_level = read_level_for(estimate, config)
        probe = self._probe_level()
        level = usual_level if probe is None else probe
        # A read without an estimate or away from the estimate's level is a probe: what it finds restarts the
        # estimate (a probe that lands on the usual level reads, and counts, as usual).
        probing = estimate is None or level != usual_level
        shards = index_keys(config.swarm_name, config.index_shards, level)
        if level == 0 and self._empty_reads:  # after an empty read, all of level 0: only small swarms write there
            count = shards_per_read(0.0, level, config)
        elif probing:  # a few shards, as a first read does
            count = shards_per_read(None, level, config)
        else:
            count = shards_per_read(estimate, level, config)
        shard_keys = [shards[(self._rotation + i) % len(shards)] for i in range(count)]
        self._rotation += count
        # A shard's expiration is that of its newest entry (written with now + ttl): asking for a copy updated
        # within index_staleness skips stale copies (our own cache included) without traversing every replica.
        sufficient = self._clock.time() + config.record_ttl - config.index_staleness
        results = await asyncio.wait_for(
            dht.get_many(shard_keys, sufficient_expiration_time=sufficient, beam_size=config.dht_lookup_beam),
            config.fetch_timeout,
        )
        self._timings.record("index", self._clock.monotonic() - started)
        now = self._clock.time()
        self._index_reads += 1
        entries = size = 0
        for found in results.values():
            if found is None or not isinstance(found.value, dict):
                continue
            for subkey, item in found.value.items():
                size += len(item.value) if isinstance(item.value, bytes) else 0
                entries += self._take_index_entry(subkey, item.value, now)
        self._counters.add("index_reads")
        self._counters.add("index_entries_read", entries)
        self._counters.add("index_bytes_read", size)
        with self._lock:
            # Each read votes alike: pooling entries over shares would let one early read of a whole low level
            # (a large share) outweigh every later read of a few shards while the swarm grows.
            if entries == 0 and config.index_shards_per_poll:  # below the writers' levels, or an empty swarm
                self._empty_reads += 1
                if self._empty_reads > len(probe_levels(config)):  # every probe came back empty: nobody is left
                    self._recent_estimates.clear()
                return
            if probing:  # found after a probe: what was estimated before is not this swarm's size
                self._recent_estimates.clear()
            self._empty_reads = 0
            self._recent_estimates.append(entries * len(shards) / count)

    def _take_index_entry(self, subkey: Any, value: Any, now: float) -> bool:
        """Take one index entry; True if it is a valid entry of a peer (this one's included), which counts towards
        the estimate of the swarm's size."""
        public_key = owner_public_key(subkey)
        if public_key is None:
            return False
        if public_key == self._own_public_key:
            return True
        sender = fingerprint(public_key)
        # The index is re-read every few seconds: an entry refused once is not judged (and counted) again.
        digest = hashlib.sha256(repr((subkey, value)).encode()).digest()
        if digest in self._rejected_entries:
            return False
        try:
            entry = decode_index_entry(value, self.config.limits)
        except RecordRejected as e:
            self._remember_rejected(digest)
            self._reject(e.reason, f"index entry of {sender}: {e.detail}")
            return False
        if entry.updated_at > now + self.config.clock_skew_tolerance:
            self._remember_rejected(digest)
            self._clock_skew(sender, entry.updated_at - now)
            return False
        with self._lock:
            rest = self._unreachable.get(entry.host) if entry.host is not None else None
            if rest is not None and entry.updated_at > rest[1]:  # written after our request failed: it is back
                del self._unreachable[entry.host]
            state = self._peers.get(sender)
            if state is None:
                logger.info("peer %s found peer %s (model %r)", self._label, sender, entry.model)
            if state is None or entry.updated_at >= state.last_seen:
                self._peers[sender] = _PeerState(
                    public_key, entry.model, entry.updated_at, entry.records, self._index_reads, entry.host
                )
            else:  # an older copy (another level's, or a stale replica): the peer is listed all the same
                state.listed_by = self._index_reads
        return True

    def choose_refs(self, need: int) -> list[tuple[str, RecordRef]]:
        """Unseen fresh refs of other peers, newest first per peer, round-robin over peers until they promise
        ``need`` groups; the peers listed by the latest index read come first (their refs are the freshest known),
        in random order among peers listed by the same read. Peers whose publisher did not answer a request
        lately are left out for a while (``_UNREACHABLE_SECONDS``)."""
        now = self._clock.time()
        oldest = now - self.config.record_ttl
        resting = self._resting_hosts()
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
                if state.host is None or state.host not in resting
            }
            listed_by = {sender: state.listed_by for sender, state in self._peers.items()}
        order = [sender for sender, refs in per_peer.items() if refs]
        self._rng.shuffle(order)
        order.sort(key=lambda sender: -listed_by[sender])  # stable: random order among peers of the same read
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
        """Fetch the ``chosen`` records (from the peers that serve them, else a few keys per DHT lookup) and cache
        their valid groups."""
        if not chosen:
            return
        started = self._clock.monotonic()
        with self._lock:
            hosts = {sender: state.host for sender, state in self._peers.items()}
        served: list[tuple[str, str, RecordRef]] = []  # (host, sender, ref)
        in_dht: list[tuple[str, RecordRef]] = []
        for sender, ref in chosen:
            host = hosts.get(sender) if self._served is not None else None
            if host:
                served.append((host, sender, ref))
            else:
                in_dht.append((sender, ref))
        await asyncio.gather(self._fetch_from_dht(dht, in_dht), *(self._fetch_served(*item) for item in served))
        self._timings.record("fetch", self._clock.monotonic() - started)

    async def _fetch_from_dht(self, dht: DHTLookup, chosen: list[tuple[str, RecordRef]]) -> None:
        if not chosen:
            return
        config = self.config
        keys = {record_key(config.swarm_name, sender, ref.seq): (sender, ref) for sender, ref in chosen}
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
            if isinstance(outcome, BaseException):
                self._counters.add("fetch_failures")
                logger.debug("peer %s: record lookup failed: %r", self._label, outcome)
                outcome = dict.fromkeys(chunk)
            results.update(outcome)
        for key, found in results.items():
            sender, ref = keys[key]
            self._take_found(sender, ref, found)

    async def _fetch_served(self, host: str, sender: str, ref: RecordRef) -> None:
        assert self._served is not None
        key = record_key(self.config.swarm_name, sender, ref.seq)
        try:
            # One request and one answer: hivemind's time for one RPC answer, not a lookup's fetch_timeout, so
            # that a publisher gone silent holds up this poll's other work for seconds, not tens of seconds.
            record: SignedRecord | None = await asyncio.wait_for(
                self._served.get_served(host, key), self.config.wait_timeout
            )
        except RecordRejected as e:
            self._mark_fetched(sender, ref)  # a malformed answer is not asked for again
            self._reject(e.reason, f"record of {sender} served by {host}: {e.detail}")
            return
        except Exception as e:  # the publisher left or is unreachable: its refs rest, then are retried
            self._counters.add("fetch_failures")
            with self._lock:
                self._unreachable[host] = (self._clock.monotonic() + _UNREACHABLE_SECONDS, self._clock.time())
            logger.debug("peer %s: fetching a record from %s failed: %r", self._label, host, e)
            record = None
        if record is None:
            self._record_missing(sender, ref)
            return
        with self._lock:
            state = self._peers.get(sender)
        if state is None:
            return
        self._mark_fetched(sender, ref)
        value = self._served.open(key, owner_marker(state.public_key), record)
        if value is not None:  # else the validator refused it and counted why
            self._take_value(sender, value)

    def _resting_hosts(self) -> set[str]:
        """Hosts whose last request failed within ``_UNREACHABLE_SECONDS``: their refs are not chosen meanwhile,
        so a departed or cut-off publisher costs one timeout per rest, not one per poll. A rest ends early when the
        index shows an entry the host wrote after the failure (:meth:`_take_index_entry`): it is back."""
        now = self._clock.monotonic()
        with self._lock:
            for host in [host for host, (until, _) in self._unreachable.items() if until <= now]:
                del self._unreachable[host]
            return set(self._unreachable)

    def _record_missing(self, sender: str, ref: RecordRef) -> None:
        """Not there yet (a store still travelling) or lost: retry a few polls, then give up on it."""
        self._missing_tries[(sender, ref.seq)] += 1
        if self._missing_tries[(sender, ref.seq)] >= _MISSING_TRIES:
            del self._missing_tries[(sender, ref.seq)]
            self._seen_refs[(sender, ref.seq)] = ref.created_at
            self._counters.add("records_missing")

    def _mark_fetched(self, sender: str, ref: RecordRef) -> None:
        """``ref`` arrived: it is not fetched again, and its missing tries are over."""
        self._seen_refs[(sender, ref.seq)] = ref.created_at
        self._missing_tries.pop((sender, ref.seq), None)

    def _take_found(self, sender: str, ref: RecordRef, found: Any) -> None:
        """Take what a DHT lookup of one record returned."""
        with self._lock:
            state = self._peers.get(sender)
        if state is None:
            return
        if found is None or not isinstance(found.value, dict):
            self._record_missing(sender, ref)
            return
        self._mark_fetched(sender, ref)
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
        self._take_value(sender, value)

    def _take_value(self, sender: str, value: Any) -> None:
        """Decode one record of ``sender`` (its signature already checked) and cache its fresh groups."""
        config = self.config
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


def read_level_for(estimate: float | None, config: DHTTransportConfig) -> int:
    """The index level a reader reads when it estimates ``estimate`` peers (``None``: no estimate yet): see
    :meth:`SwarmReader.read_level`."""
    if not config.index_shards_per_poll:
        return 0
    if estimate is None:
        return config.index_max_level // 2
    per_shard_at_level_0 = estimate / (config.index_shards * config.index_shard_entries)
    level = round(math.log2(per_shard_at_level_0)) if per_shard_at_level_0 > 0 else 0
    return min(max(level, 0), config.index_max_level)


def shards_per_read(estimate: float | None, level: int, config: DHTTransportConfig) -> int:
    """How many shards of ``level`` an index read reads: ``index_shards_per_poll``, or as many more as hold
    ``index_shards_per_poll * index_shard_entries`` entries by ``estimate`` where the level's shards hold fewer
    than that (level 0 of a swarm smaller than ``index_shards * index_shard_entries``: a read of two near-empty
    shards would list too few peers to choose fresh records from); every shard with ``index_shards_per_poll`` 0."""
    shards = config.index_shards << level
    if not config.index_shards_per_poll:
        return shards
    if estimate is None:  # the first read: a probe of index_shards_per_poll shards
        return min(config.index_shards_per_poll, shards)
    per_shard = estimate / shards
    spread = round(config.index_shard_entries / per_shard) if per_shard > 0 else shards
    return min(config.index_shards_per_poll * max(1, spread), shards)


def write_levels_for(estimate: float | None, config: DHTTransportConfig) -> range:
    """The index levels a publisher writes to when its peer estimates ``estimate`` peers (``None``: no estimate
    yet, every level): from one below the level a reader of that estimate reads (readers estimating half as many
    find it) to two above the last level whose shards hold an entry (readers estimating twice as many). At most
    about 5 levels, whose shards hold at most ~2 x ``index_shard_entries`` entries: a store's cost is flat in N."""
    if estimate is None:
        return range(config.index_max_level + 1)
    per_shard_at_level_0 = estimate / config.index_shards
    filled = math.floor(math.log2(per_shard_at_level_0)) if per_shard_at_level_0 >= 1 else 0
    top = min(filled + _WRITE_LEVELS_ABOVE, config.index_max_level)
    bottom = max(0, min(read_level_for(estimate, config) - _WRITE_LEVELS_BELOW, top))
    return range(bottom, top + 1)


def probe_levels(config: DHTTransportConfig) -> list[int]:
    """The levels a reader probes in turn while its reads find nothing: the middle one (its first read), level 0,
    then every third level and the top. A writer's levels span at least three (:func:`write_levels_for`), so
    one of these lies among them whatever the swarm's size."""
    top = config.index_max_level
    order = [top // 2, 0, *range(2, top + 1, 3), top]
    return list(dict.fromkeys(level for level in order if level <= top))


def _group_id(item: ReceivedGroup) -> tuple[str, str, float]:
    return item.sender, item.group.group_id, item.group.created_at
