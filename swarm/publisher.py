"""The writing side of a DHT peer: queue groups as signed records, serve (or store) them, announce them at once, and
keep this peer's index entry current."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hivemind.utils.crypto import RSAPrivateKey

from swarm.announcements import AnnouncedRecord, encode_announcement, record_digest
from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.records import Group, GroupRecord, IndexEntry, RecordRef, encode_index_entry, encode_record
from swarm.sender_state import announcement_period
from swarm.served import ServedRecords
from swarm.transport import SwarmCounters, TimingLog
from swarm.validation import fingerprint, index_key_of, open_served, owner_marker, record_key

logger = logging.getLogger(__name__)

_ANNOUNCED_RECORDS = 2  # records an announcement lists: the newest and the one before (for a reader that missed it)


class DHTStore(Protocol):
    """The one DHT operation a publisher needs: hivemind's :meth:`DHTNode.store_many`."""

    async def store_many(
        self,
        keys: list[str],
        values: list[bytes],
        expiration_time: float | list[float],
        subkeys: list[Any],
        beam_size: int | None = None,
    ) -> dict[Any, bool]:
        """``{(key, subkey): stored}``; ``beam_size``: the nodes the search for each key's replicas keeps asking."""
        ...


class SwarmPublisher:
    """Queues published groups (never waiting on the network), then serves or stores and announces them.

    Each :meth:`queue` call becomes one record ``{swarm}/records/{peer}/{seq}``, served by this peer
    (:mod:`swarm.served`) or, without ``served``, stored in the DHT. As soon as it is served (or stored), an
    announcement listing this peer's newest records goes out on its announcement topics (``announce``, signed with
    ``signing_key``: :mod:`swarm.announcements`). This peer's index entry, which lists its newest records (and, when it
    serves them, its libp2p id), is stored in its shard of each index level of ``write_levels()`` (counted as
    ``index_stores``) every ``announce_interval`` seconds, at every publication when there are no announcements, and
    not before ``may_write_index()`` says so (the reader's first index read: a peer that has not looked does not know
    where to write). A full queue drops its oldest record (``publish_dropped``): a slow network costs stale groups,
    never memory. DHT values are signed under this peer's owner marker by the DHT's validator, so other peers accept
    them only as this peer's.

    Args:
        config: the transport's settings (key layout, ttl, limits, queue size, intervals).
        public_key: this peer's key: its owner marker and its id.
        counters: where stores, announcements and their failures are counted.
        timings: where store durations are recorded.
        clock: wall time dates records and entries; monotonic time spaces index stores and "still here"
            announcements.
        write_levels: the index levels to write the entry to, asked at every store; the transport passes its
            reader's :meth:`~swarm.reader.SwarmReader.write_levels`. ``None``: every level up to
            ``config.index_max_level``, which any reader finds whatever level it reads.
        served: where this peer serves its own records once its ``host`` is known; ``None`` (or no host yet): the
            records are stored in the DHT on ``dht_num_replicas`` peers.
        announce: publishes announcement bytes on this peer's topics, True if sent (:meth:`swarm.gossip.Gossip.
            announce`); ``None``: no announcements.
        signing_key: signs announcements (this peer's record key); required with ``announce``.
        may_write_index: whether the index entry may be stored yet; ``None``: always.
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
        announce: Callable[[bytes], Awaitable[bool]] | None = None,
        signing_key: RSAPrivateKey | None = None,
        may_write_index: Callable[[], bool] | None = None,
    ):
        if announce is not None and signing_key is None:
            raise ValueError("a publisher that announces needs the signing key its announcements are signed with")
        self.config = config
        self._peer_id = fingerprint(public_key)
        self._marker = owner_marker(public_key)
        self._write_levels = write_levels or (lambda: range(config.index_max_level + 1))
        self._served = served
        self._announce = announce
        self._signing_key = signing_key
        self._may_write_index = may_write_index or (lambda: True)
        self._counters = counters
        self._timings = timings
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: collections.deque[_Pending] = collections.deque()
        self._recent_refs: collections.deque[RecordRef] = collections.deque(maxlen=config.index_records)
        self._announced: collections.deque[AnnouncedRecord] = collections.deque(maxlen=_ANNOUNCED_RECORDS)
        self._next_seq = int(clock.time() * 1000)  # ms clock: sequence numbers stay unique across restarts
        self._last_index_store = -float("inf")
        self._listed_records = False  # whether the last index entry stored listed a record
        self._announced_at: collections.deque[float] = collections.deque(maxlen=4)  # monotonic times, oldest first

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
        tasks = tuple(dict.fromkeys(group.provenance.task for group in groups))
        self.queue_encoded(data, len(groups), now, tasks)

    def queue_encoded(self, data: bytes, num_groups: int, created_at: float, tasks: tuple[str, ...] = ()) -> None:
        """Queue record bytes already encoded (and checked) by :meth:`queue`; tests queue unchecked bytes here."""
        with self._lock:
            seq = self._next_seq = max(self._next_seq + 1, int(created_at * 1000))
            if len(self._pending) >= self.config.max_pending_publishes:
                self._pending.popleft()
                self._counters.add("publish_dropped")
            self._pending.append(_Pending(seq, data, num_groups, created_at, tasks))
        self._counters.add("queued_records")

    def _due(self, last: float) -> bool:
        return self._clock.monotonic() - last >= self.config.announce_interval

    async def flush(self, dht: DHTStore) -> None:
        """Publish every queued record; with none queued, store the index entry and say "still here" when due."""
        while True:
            with self._lock:
                batch = list(self._pending)
                self._pending.clear()
            if batch:
                await self._publish(dht, batch)
                continue
            if not self.config.announce:
                return
            if self._due(self._last_index_store) and self._may_write_index():
                await self._store(dht, [], index=True)  # the index entry alone: "this peer is here"
            if self._announce is not None and self._announcement_due():
                await self._send_announcement()
            return

    def _announcement_due(self) -> bool:
        """Silent for this peer's announcement period (:func:`swarm.sender_state.announcement_period`): say "still
        here"."""
        times = list(self._announced_at)
        if not times:
            return True
        return self._clock.monotonic() - times[-1] >= announcement_period(times, self.config.announce_interval)

    async def _publish(self, dht: DHTStore, batch: list[_Pending]) -> None:
        """Serve (or store) ``batch``, announce it, and store the index entry if due (always without announcements)."""
        with self._lock:
            for item in batch:
                self._recent_refs.append(
                    RecordRef(seq=item.seq, created_at=item.created_at, num_groups=item.num_groups)
                )
                self._announced.append(
                    AnnouncedRecord(
                        item.seq, item.created_at, item.num_groups, len(item.data), record_digest(item.data), item.tasks
                    )
                )
        host = self._served.host if self._served is not None else None
        # with announcements, the index entry is for late joiners: rewritten every announce_interval, and at the first
        # publication after an entry that listed no record yet
        stale = self._due(self._last_index_store) or not self._listed_records
        index = self._may_write_index() and (self._announce is None or stale)
        if self._served is not None:
            # kept in client mode too (stored in the DHT as well): a peer that becomes reachable again names itself as
            # the host of the records its entry lists, and must then serve these, not leave them as strikes against it
            expiration_time = self._clock.time() + self.config.record_ttl
            for item in batch:
                self._served.serve(self._record_key(item.seq), self._marker, item.data, expiration_time)
        stored = await self._store(dht, [] if host is not None else batch, index=index)
        announced = await self._send_announcement() if self._announce is not None else False
        if host is not None and not announced and not index and self._may_write_index():
            # the announcement did not go out: the index entry is how readers learn of the record
            stored = await self._store(dht, [], index=True)
            index = True
        for item in batch:
            key = self._record_key(item.seq)
            # A served record is published once it is announced or an index entry lists it; a stored one once stored.
            if (announced or (index and stored.get("index"))) if host is not None else stored.get(key):
                self._counters.add("published_records")
                self._counters.add("published_groups", item.num_groups)
                self._counters.add("published_bytes", len(item.data))
            else:
                self._counters.add("publish_failures")

    async def store_served(self, dht: DHTStore) -> int:
        """Store in the DHT the records this peer serves that have not expired, each until its own expiry, in one
        request: at the switch to client mode, when readers that learn of them from the index entry or an
        announcement (which name no host from then on) look for them in the DHT. Returns how many were stored
        (counted as ``stored_at_switch``); a failure is logged and counted, never raised."""
        if self._served is None:
            return 0
        keys, values, expirations = [], [], []
        for key, record in self._served.live():
            data = open_served(self._served.validator, key, self._marker, record.value, record.expiration_time)
            if data is not None:  # its own record, signed by this peer: refused only if it changed under us
                keys.append(key)
                values.append(data)
                expirations.append(record.expiration_time)
        if not keys:
            return 0
        try:
            result = await self._store_many(dht, keys, values, expirations)
        except Exception as e:  # a lost connection: the records stay served, as before the switch
            self._counters.add("publish_failures")
            logger.warning("peer %s: storing its %d served record(s) failed: %s: %s", self._peer_id, len(keys),
                           type(e).__name__, e)  # fmt: skip
            return 0
        stored = sum(1 for key in keys if result.get((key, self._marker)))
        self._counters.add("stored_at_switch", stored)
        return stored

    async def _store_many(
        self, dht: DHTStore, keys: list[str], values: list[bytes], expiration_time: float | list[float]
    ) -> dict[Any, bool]:
        """``dht.store_many`` of ``keys`` under this peer's owner marker, within ``store_timeout`` (timed as
        ``publish``); ``{(key, marker): stored}``, empty after a timeout (counted and logged)."""
        started = self._clock.monotonic()
        try:
            return await asyncio.wait_for(
                dht.store_many(keys, values, expiration_time, subkeys=[self._marker] * len(keys),
                               beam_size=self.config.dht_lookup_beam),
                self.config.store_timeout,
            )  # fmt: skip
        except TimeoutError:
            self._counters.add("store_timeouts")
            logger.warning("peer %s: storing %d value(s) timed out", self._peer_id, len(keys))
            return {}
        finally:
            self._timings.record("publish", self._clock.monotonic() - started)

    def _record_key(self, seq: int) -> str:
        return record_key(self.config.swarm_name, self._peer_id, seq)

    async def _send_announcement(self) -> bool:
        """Sign and publish an announcement of this peer's newest records (none yet: "still here")."""
        assert self._announce is not None and self._signing_key is not None
        with self._lock:
            records = list(self._announced)
        host = self._served.host if self._served is not None else None
        data = encode_announcement(
            self._signing_key, self.config.swarm_name, self.config.model_name, self._clock.time(), host, records,
            self.config.limits,
        )  # fmt: skip
        self._announced_at.append(self._clock.monotonic())
        return await self._announce(data)

    async def _store(self, dht: DHTStore, batch: list[_Pending], index: bool) -> dict[str, bool]:
        """Store ``batch``'s records in the DHT and, with ``index``, this peer's index entry at its levels; returns
        ``{record key: stored}`` and ``"index"``: whether every index level took the entry."""
        if not batch and not index:
            return {}
        config = self.config
        now = self._clock.time()
        expiration_time = now + config.record_ttl
        record_keys = [self._record_key(item.seq) for item in batch]
        keys, values = list(record_keys), [item.data for item in batch]
        entry_keys: list[str] = []
        if index:
            with self._lock:
                refs = list(self._recent_refs)
            host = self._served.host if self._served is not None else None
            entry = IndexEntry(model=config.model_name, records=refs, updated_at=now, host=host)
            self._listed_records = bool(refs)
            entry_keys = self.index_keys()
            keys += entry_keys
            values += [encode_index_entry(entry, config.limits)] * len(entry_keys)
            self._last_index_store = self._clock.monotonic()
        result = await self._store_many(dht, keys, values, expiration_time)
        outcome = {key: bool(result.get((key, self._marker))) for key in record_keys}
        if index:
            stored = sum(1 for key in entry_keys if result.get((key, self._marker)))
            self._counters.add("index_stores", stored)
            if stored < len(entry_keys):
                self._counters.add("index_store_failures")
            outcome["index"] = stored == len(entry_keys)
        return outcome


@dataclass(frozen=True)
class _Pending:
    """A queued record: its sequence number, bytes, groups, date and the tasks of its groups."""

    seq: int
    data: bytes
    num_groups: int
    created_at: float
    tasks: tuple[str, ...] = ()
