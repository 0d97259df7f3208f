"""The writing side of a DHT peer: queue groups as signed records, store them with this peer's index entries."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.records import Group, GroupRecord, IndexEntry, RecordRef, encode_index_entry, encode_record
from swarm.served import ServedRecords
from swarm.transport import SwarmCounters, TimingLog
from swarm.validation import fingerprint, index_key_of, owner_marker, record_key

logger = logging.getLogger(__name__)


class DHTStore(Protocol):
    """The one DHT operation a publisher needs: hivemind's :meth:`DHTNode.store_many`."""

    async def store_many(
        self,
        keys: list[str],
        values: list[bytes],
        expiration_time: float,
        subkeys: list[Any],
        beam_size: int | None = None,
    ) -> dict[Any, bool]:
        """``{(key, subkey): stored}``; ``beam_size``: the nodes the search for each key's replicas keeps asking."""
        ...


class SwarmPublisher:
    """Queues published groups (never waiting on the network) and stores them from the event loop.

    Each :meth:`queue` call becomes one record ``{swarm}/records/{peer}/{seq}``, served by this peer
    (:mod:`swarm.served`) or, without ``served``, stored in the DHT; every store also rewrites this peer's index
    entry, which lists its newest records (and, when it serves them, its libp2p id), in its shard of each index
    level of ``write_levels()`` (counted as ``index_stores``). A full queue drops its oldest record
    (``publish_dropped``): a slow network costs stale groups, never memory. All values are signed under this peer's
    owner marker by the DHT's validator, so other peers accept them only as this peer's.

    Args:
        config: the transport's settings (key layout, ttl, limits, queue size).
        public_key: this peer's key: its owner marker and its id.
        counters: where stores and their failures are counted.
        timings: where store durations are recorded.
        clock: wall time dates records and entries; monotonic time spaces announcements.
        write_levels: the index levels to write the entry to, asked at every store; the transport passes its
            reader's :meth:`~swarm.reader.SwarmReader.write_levels` (a few levels around the one readers read).
            ``None``: every level up to ``config.index_max_level``, which any reader finds whatever level it reads.
        served: where this peer serves its own records once its ``host`` is known; ``None`` (or no host yet): the
            records are stored in the DHT on ``dht_num_replicas`` peers.
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        public_key: bytes,
        counters: SwarmCounters,
        timings: TimingLog,
        clock: Clock = SYSTEM_CLOCK,
        write_levels: Callable[[], range] | None = None,
        served: ServedRecords | None = None,
    ):
        self.config = config
        self._peer_id = fingerprint(public_key)
        self._marker = owner_marker(public_key)
        self._write_levels = write_levels or (lambda: range(config.index_max_level + 1))
        self._served = served
        self._counters = counters
        self._timings = timings
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: collections.deque[tuple[int, bytes, int, float]] = collections.deque()
        self._recent_refs: collections.deque[RecordRef] = collections.deque(maxlen=config.index_records)
        self._next_seq = int(clock.time() * 1000)  # ms clock: sequence numbers stay unique across restarts
        self._last_index_store = -float("inf")

    @property
    def index_key(self) -> str:
        """The lowest index shard this peer's next store writes its entry to (level 0 while the swarm is small)."""
        return self.index_keys()[0]

    def index_keys(self) -> list[str]:
        """The index shards this peer's next store writes its entry to: one per level of ``write_levels()``."""
        config = self.config
        levels = [level for level in self._write_levels() if 0 <= level <= config.index_max_level] or [0]
        return [index_key_of(config.swarm_name, config.index_shards, level, self._peer_id) for level in levels]

    def recent_refs(self) -> list[RecordRef]:
        """References to this peer's newest records, as its index entry lists them (oldest first)."""
        with self._lock:
            return list(self._recent_refs)

    def queue(self, groups: Sequence[Group]) -> None:
        """Encode ``groups`` as one record and queue it; raises RecordRejected if they break this peer's limits."""
        now = self._clock.time()
        data = encode_record(GroupRecord(groups=list(groups), created_at=now), self.config.limits)
        self.queue_encoded(data, len(groups), now)

    def queue_encoded(self, data: bytes, num_groups: int, created_at: float) -> None:
        """Queue record bytes already encoded (and checked) by :meth:`queue`; tests queue unchecked bytes here."""
        with self._lock:
            seq = self._next_seq = max(self._next_seq + 1, int(created_at * 1000))
            if len(self._pending) >= self.config.max_pending_publishes:
                self._pending.popleft()
                self._counters.add("publish_dropped")
            self._pending.append((seq, data, num_groups, created_at))
        self._counters.add("queued_records")

    async def flush(self, dht: DHTStore) -> None:
        """Store every queued record; with none queued, renew the index entry when announce_interval has passed."""
        while True:
            with self._lock:
                batch = list(self._pending)
                self._pending.clear()
            if not batch:
                due = self._clock.monotonic() - self._last_index_store >= self.config.announce_interval
                if self.config.announce and due:
                    await self._store(dht, [])  # the index entry alone: "this peer is here"
                return
            await self._store(dht, batch)

    async def _store(self, dht: DHTStore, batch: list[tuple[int, bytes, int, float]]) -> None:
        config = self.config
        with self._lock:
            for seq, _, num_groups, created_at in batch:
                self._recent_refs.append(RecordRef(seq=seq, created_at=created_at, num_groups=num_groups))
            refs = list(self._recent_refs)
        now = self._clock.time()
        expiration_time = now + config.record_ttl
        record_keys = [record_key(config.swarm_name, self._peer_id, seq) for seq, *_ in batch]
        host = self._served.host if self._served is not None else None
        if host is not None:  # served from here: only the index entry goes to the DHT
            for key, (_, data, *_) in zip(record_keys, batch, strict=True):
                self._served.serve(key, self._marker, data, expiration_time)
            dht_keys, dht_values = [], []
        else:
            dht_keys, dht_values = list(record_keys), [data for _, data, *_ in batch]
        entry = IndexEntry(model=config.model_name, records=refs, updated_at=now, host=host)
        index_bytes = encode_index_entry(entry, config.limits)
        entry_keys = self.index_keys()
        keys = dht_keys + entry_keys
        values = dht_values + [index_bytes] * len(entry_keys)
        started = self._last_index_store = self._clock.monotonic()
        try:
            result = await asyncio.wait_for(
                dht.store_many(
                    keys,
                    values,
                    expiration_time,
                    subkeys=[self._marker] * len(keys),
                    beam_size=config.dht_lookup_beam,
                ),
                config.store_timeout,
            )
        except asyncio.TimeoutError:
            result = {}
            self._counters.add("store_timeouts")
            logger.warning("peer %s: storing %d record(s) timed out", self._peer_id, len(batch))
        self._timings.record("publish", self._clock.monotonic() - started)
        stored = sum(1 for key in entry_keys if result.get((key, self._marker)))
        for key, (_, data, num_groups, _) in zip(record_keys, batch, strict=True):
            # A served record is published once an index entry listing it is in the DHT.
            if result.get((key, self._marker)) if host is None else stored:
                self._counters.add("published_records")
                self._counters.add("published_groups", num_groups)
                self._counters.add("published_bytes", len(data))
            else:
                self._counters.add("publish_failures")
        self._counters.add("index_stores", stored)
        if stored < len(entry_keys):
            self._counters.add("index_store_failures")
