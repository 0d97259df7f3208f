"""Reading the swarm's index: which shards a read reads, what it costs, and the estimate of N it yields.

The index is for bootstrap, late joiners, :meth:`~swarm.transport.SwarmTransport.peers` and the estimate of the
swarm's size N; fresh records arrive by announcements (:mod:`swarm.gossip`). A read returns about
``index_shards_per_poll * index_shard_entries`` entries at any N (more shards of level 0 while the swarm is too small
to fill them: :func:`swarm.levels.shards_per_read`): the reader estimates N from its last few reads (the mean of
each read's entries over the share of its level's shards it read) and reads the level whose shards hold about
``index_shard_entries`` entries; its peer's publisher writes the levels :func:`swarm.levels.write_levels_for` gives.
With announcements on, a read goes in rotation over the shards that hold the peers of this peer's announcement topic
(:func:`swarm.levels.topic_index_shards`): those are the peers it connects to so that the topic's mesh forms. A
probe reads anywhere on its level: the topic is only as good as the estimate.

Before the first read that finds entries, the estimate is ``None`` and a read is a probe: the first probes the
level a prior estimate points to (the DHT's own, from the distances of this peer's nearest neighbours, when there is
one; the middle level otherwise), and reads that find nothing are followed by probes of level 0 and every third
level (:func:`swarm.levels.probe_levels`) until one finds entries, which start the estimate afresh.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import random
import threading
from collections.abc import Callable
from typing import Any

from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.fetcher import DHTLookup
from swarm.levels import probe_levels, read_level_for, shards_per_read, topic_index_shards, write_levels_for
from swarm.records import IndexEntry, RecordRejected, decode_index_entry
from swarm.transport import SwarmCounters, TimingLog
from swarm.validation import RejectionLog, index_keys

_ESTIMATE_READS = 8  # index reads pooled into the estimate of the swarm's size
_EMPTY_READS_BEFORE_PROBING = 2  # with an estimate: two reads of ~4 entries both empty is chance 1 in ~3000, not one
_REJECTED_ENTRIES_KEPT = 10_000  # digests of refused index entries: one count per entry, not one per read


class IndexReader:
    """Reads index shards and hands every entry to ``on_entry``; keeps the estimate of the swarm's size.

    Args:
        config: the index layout and read sizes.
        counters: where reads, entries and their bytes are counted.
        timings: where each read's duration goes (``index``).
        clock: monotonic time measures reads; wall time dates them.
        rng: where the rotation over shards starts (peers start at different shards).
        on_entry: called with ``(subkey, value, now)`` for every entry read; returns True for a valid entry of a
            peer (this one's included), which counts towards the estimate.
        prior: a rough estimate of N from elsewhere (the DHT's routing table), or ``None``; used before the index
            yields one.
        topic: the announcement topic whose peers reads should list, as ``(shard, level)``; ``None``: reads rotate
            over every shard of their level.
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        counters: SwarmCounters,
        timings: TimingLog,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        on_entry: Callable[[Any, Any, float], bool] = lambda subkey, value, now: False,
        prior: Callable[[], float | None] = lambda: None,
        topic: Callable[[], tuple[int, int] | None] = lambda: None,
    ):
        self.config = config
        self._counters = counters
        self._timings = timings
        self._clock = clock
        self._on_entry = on_entry
        self._prior = prior
        self._topic = topic
        self._lock = threading.Lock()
        self._rotation_start = (rng or random.Random()).randrange(1 << 30)
        # each level's own place in its shards: a rotation shared by the levels a probe takes turns at moved on by
        # the other levels' reads, and a level could come round to the same few shards every time
        self._rotation: dict[int, int] = {}
        self._recent_estimates: collections.deque[float] = collections.deque(maxlen=_ESTIMATE_READS)
        self._empty_reads = 0  # index reads in a row that found no entry: the next ones probe (probe_levels)
        self.reads = 0  # reads done
        self._rejected: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    # ------------------------------------------------------------------------------ the estimate

    def estimated_peers(self) -> float | None:
        """The number of peers listed in the index, estimated from the last few index reads; ``None`` before a read
        found entries."""
        with self._lock:
            if not self._recent_estimates:
                return None
            return sum(self._recent_estimates) / len(self._recent_estimates)

    def size_estimate(self) -> float | None:
        """The best estimate of N at hand: the index's, else the prior's, else 1 once a read found nobody (a new
        swarm), else ``None``."""
        estimate = self.estimated_peers()
        if estimate is None:
            estimate = self._prior()
        if estimate is None and self.reads:
            estimate = 1.0
        return estimate

    def read_level(self) -> int:
        """The index level the next read reads (see the module docstring)."""
        probe = self._probe_level()
        return probe if probe is not None else read_level_for(self.estimated_peers(), self.config)

    def _probe_level(self) -> int | None:
        if not self.config.index_shards_per_poll:
            return None
        if self.estimated_peers() is None and self._empty_reads == 0:  # the first probe: where the prior points
            prior = self._prior()
            return read_level_for(prior, self.config) if prior is not None else None
        probing_after = 1 if self.estimated_peers() is None else _EMPTY_READS_BEFORE_PROBING
        if self._empty_reads >= probing_after:
            probes = probe_levels(self.config)
            return probes[self._empty_reads % len(probes)]
        return None

    def write_levels(self) -> range:
        """The index levels this peer's publisher writes its entry to (:func:`swarm.levels.write_levels_for` of
        :meth:`size_estimate`)."""
        return write_levels_for(self.size_estimate(), self.config)

    # ------------------------------------------------------------------------------ reading

    def _shards(self, level: int, count: int, by_topic: bool) -> list[str]:
        """``count`` shard keys of ``level`` in rotation (over the topic's shards when ``by_topic`` and there is a
        topic)."""
        config = self.config
        shards = index_keys(config.swarm_name, config.index_shards, level)
        topic = self._topic() if by_topic else None
        if topic is not None:
            shards = [shards[i] for i in topic_index_shards(topic[0], topic[1], level, config)]
        count = min(count, len(shards))
        at = self._rotation.get(level, self._rotation_start)
        keys = [shards[(at + i) % len(shards)] for i in range(count)]
        self._rotation[level] = at + count
        return keys

    async def read(self, dht: DHTLookup) -> int:
        """Read the next shards and hand their entries on; returns the valid entries found."""
        config = self.config
        started = self._clock.monotonic()
        estimate = self.estimated_peers()
        usual_level = read_level_for(estimate, config)
        probe = self._probe_level()
        level = usual_level if probe is None else probe
        # A read without an estimate or away from the estimate's level is a probe: what it finds restarts the
        # estimate (a probe that lands on the usual level reads, and counts, as usual).
        probing = estimate is None or level != usual_level
        if level == 0 and self._empty_reads:  # after an empty read, all of level 0: only small swarms write there
            count = shards_per_read(0.0, level, config)
        elif probing:  # a few shards, as a first read does
            count = shards_per_read(None, level, config)
        else:
            count = shards_per_read(estimate, level, config)
        # A probe reads anywhere on its level: the topic comes from the estimate being probed for (or a prior), and
        # its shards may hold none of the peers a probe must find.
        shard_keys = self._shards(level, count, by_topic=not probing)
        # A shard's expiration is that of its newest entry (written with now + ttl): asking for a copy updated
        # within index_staleness skips stale copies (our own cache included) without traversing every replica.
        sufficient = self._clock.time() + config.record_ttl - config.index_staleness
        results = await asyncio.wait_for(
            dht.get_many(shard_keys, sufficient_expiration_time=sufficient, beam_size=config.dht_lookup_beam),
            config.fetch_timeout,
        )
        self._timings.record("index", self._clock.monotonic() - started)
        now = self._clock.time()
        self.reads += 1
        entries = size = 0
        for found in results.values():
            if found is None or not isinstance(found.value, dict):
                continue
            for subkey, item in found.value.items():
                size += len(item.value) if isinstance(item.value, bytes) else 0
                entries += self._on_entry(subkey, item.value, now)
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
                return 0
            if probing:  # found after a probe: what was estimated before is not this swarm's size
                self._recent_estimates.clear()
            self._empty_reads = 0
            self._recent_estimates.append(entries * (config.index_shards << level) / len(shard_keys))
        return entries

    # ------------------------------------------------------------------------------ entries refused once

    def decode(self, subkey: Any, value: Any, on_reject: RejectionLog, sender: str) -> IndexEntry | None:
        """The entry in ``value``, or ``None`` if it is refused; a refused entry is judged (and counted) once, not
        at every read that finds it again."""
        digest = self.digest_of(subkey, value)
        if digest in self._rejected:
            return None
        try:
            return decode_index_entry(value, self.config.limits)
        except RecordRejected as e:
            self.remember_rejected(digest)
            on_reject(e.reason, f"index entry of {sender}: {e.detail}")
            return None

    def remember_rejected(self, digest: bytes) -> None:
        """Refuse the entry of this digest from now on without judging it again."""
        self._rejected[digest] = None
        while len(self._rejected) > _REJECTED_ENTRIES_KEPT:
            self._rejected.popitem(last=False)

    @staticmethod
    def digest_of(subkey: Any, value: Any) -> bytes:
        """The digest under which an entry is remembered as refused."""
        return hashlib.sha256(repr((subkey, value)).encode()).digest()
