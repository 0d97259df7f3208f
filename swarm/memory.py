"""In-process stand-ins for the swarm: MemorySwarm (a whole swarm of transports), DictDHT (a DHT node's store and
lookup over a dictionary) and MemoryPubsub (announcement topics), for tests and simulation."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm.clock import Clock
from swarm.records import Group, ReceivedGroup, RecordLimits, RecordRejected, validate_group
from swarm.transport import PeerInfo, SwarmCounters, SwarmTransport, TransportReadout


@dataclass
class _Board:
    """Everything published in one in-memory swarm: (sender, sequence number, group) in order."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    groups: list[tuple[str, int, Group]] = field(default_factory=list)
    models: dict[str, tuple[str, float]] = field(default_factory=dict)
    next_seq: int = 0


class MemorySwarm:
    """A swarm that lives in one process; :meth:`join` makes a transport for one peer.

    Example:
        >>> swarm = MemorySwarm()
        >>> alice, bob = swarm.join("alice"), swarm.join("bob")
    """

    def __init__(self, limits: RecordLimits = RecordLimits(), seed: int = 0):
        self.limits = limits
        self._board = _Board()
        self._rng = random.Random(seed)

    def join(self, peer_id: str, model: str = "") -> MemoryTransport:
        """A transport for peer ``peer_id`` in this swarm."""
        return MemoryTransport(self, peer_id, model)

    def inject(self, sender: str, group: Group) -> None:
        """Put a group on the board without validation, as a hostile or buggy peer would (tests)."""
        with self._board.lock:
            self._board.groups.append((sender, self._board.next_seq, group))
            self._board.next_seq += 1


class MemoryTransport(SwarmTransport):
    """One peer's view of a :class:`MemorySwarm`: same contract as :class:`swarm.dht.DHTTransport`."""

    def __init__(self, swarm: MemorySwarm, peer_id: str, model: str = ""):
        self._swarm = swarm
        self._peer_id = peer_id
        self._model = model
        self._cursor_seen: set[int] = set()
        self._counters = SwarmCounters()
        self._closed = False
        with swarm._board.lock:  # listed from the start, as a DHT peer announces itself on joining
            swarm._board.models[peer_id] = (model, time.time())

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def publish(self, groups: Sequence[Group]) -> None:
        if self._closed:
            raise RuntimeError(f"transport of peer {self._peer_id!r} is closed")
        if len(groups) > self._swarm.limits.max_groups_per_record:
            raise RecordRejected("too_many_groups", f"{len(groups)} > {self._swarm.limits.max_groups_per_record}")
        checked = [validate_group(g, self._swarm.limits) for g in groups]
        board = self._swarm._board
        with board.lock:
            for group in checked:
                board.groups.append((self._peer_id, board.next_seq, group))
                board.next_seq += 1
            board.models[self._peer_id] = (self._model, time.time())
        self._counters.add("published_records")
        self._counters.add("published_groups", len(checked))

    def fetch(self, max_groups: int) -> list[ReceivedGroup]:
        if max_groups <= 0 or self._closed:
            return []
        board = self._swarm._board
        with board.lock:
            candidates = [
                (sender, seq, group)
                for sender, seq, group in board.groups
                if sender != self._peer_id and seq not in self._cursor_seen
            ]
        fresh: list[tuple[int, ReceivedGroup]] = []
        for sender, seq, group in candidates:
            self._cursor_seen.add(seq)
            try:
                group = validate_group(group, self._swarm.limits)
            except RecordRejected as e:
                self._counters.reject(e.reason)
                continue
            fresh.append((seq, ReceivedGroup(sender=sender, group=group)))
        self._swarm._rng.shuffle(fresh)  # ties of date in random order
        fresh.sort(key=lambda item: -item[1].group.created_at)  # newest first, as every transport hands them out
        taken, kept = fresh[:max_groups], fresh[max_groups:]
        # Groups not taken now stay available for the next fetch, like the DHT transport's cache.
        self._cursor_seen.difference_update(seq for seq, _ in kept)
        self._counters.add("fetched_groups", len(taken))
        return [item for _, item in taken]

    def peers(self) -> list[PeerInfo]:
        board = self._swarm._board
        with board.lock:
            return [
                PeerInfo(peer=peer, model=model, last_seen=seen)
                for peer, (model, seen) in board.models.items()
                if peer != self._peer_id
            ]

    def readout(self) -> TransportReadout:
        with self._swarm._board.lock:
            published = sum(1 for sender, _, _ in self._swarm._board.groups if sender == self._peer_id)
        return TransportReadout(
            peer_id=self._peer_id,
            healthy=not self._closed,
            counters=self._counters.snapshot(),
            gauges={"board_groups_of_this_peer": float(published), "seen_ids": float(len(self._cursor_seen))},
        )

    def close(self) -> None:
        self._closed = True


class DictDHT:
    """hivemind's ``store_many`` / ``get_many`` over a dictionary, as if every store had arrived everywhere.

    What :class:`swarm.publisher.SwarmPublisher` and :class:`swarm.reader.SwarmReader` need of a DHT node, without
    p2pd: unit tests and simulations run the real publisher and reader on it. It records the keys of every lookup
    (``reads``) and the bytes lookups returned (``bytes_read``). Given a ``clock``, lookups leave out values expired
    by its wall time, as hivemind does; without one, values never expire.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.items: dict[str, dict[Any, Any]] = {}  # key -> {subkey: ValueWithExpiration}
        self.reads: list[list[str]] = []
        self.bytes_read = 0
        self._clock = clock

    async def store_many(
        self,
        keys: list[str],
        values: list[bytes],
        expiration_time: float,
        subkeys: list[Any],
        beam_size: int | None = None,
    ) -> dict[Any, bool]:
        """Store every value under its key and subkey; all succeed."""
        from hivemind.utils import ValueWithExpiration

        for key, value, subkey in zip(keys, values, subkeys, strict=True):
            self.items.setdefault(key, {})[subkey] = ValueWithExpiration(value, expiration_time)
        return {(key, subkey): True for key, subkey in zip(keys, subkeys, strict=True)}

    async def get_many(
        self,
        keys: list[str],
        sufficient_expiration_time: float | None = None,
        num_workers: int | None = None,
        beam_size: int | None = None,
    ) -> dict[str, Any]:
        """``{key: ValueWithExpiration({subkey: ValueWithExpiration}) or None}``, as hivemind returns them (every
        node answers at once here: ``num_workers`` and ``beam_size`` change nothing)."""
        from hivemind.utils import ValueWithExpiration

        self.reads.append(list(keys))
        found: dict[str, Any] = {}
        now = None if self._clock is None else self._clock.time()
        for key in keys:
            entries = self.items.get(key)
            if entries is not None and now is not None:
                entries = {subkey: item for subkey, item in entries.items() if item.expiration_time >= now} or None
            if entries is not None:
                self.bytes_read += sum(len(item.value) for item in entries.values() if isinstance(item.value, bytes))
            found[key] = None if entries is None else ValueWithExpiration(entries, 0.0)
        return found


class MemoryPubsub:
    """Pubsub topics in one process, for tests and simulations: a message published on a topic reaches every
    subscriber of it at once, the publisher included, as GossipSub delivers it (without its duplicates). Counts the
    messages and bytes delivered per subscriber (``delivered``)."""

    def __init__(self) -> None:
        self.subscribers: dict[str, dict[str, Any]] = {}  # topic -> {host: callback(data, publisher host)}
        self.delivered: Counter[str] = Counter()  # host -> messages delivered
        self.delivered_bytes: Counter[str] = Counter()

    def subscribe(self, topic: str, host: str, callback: Any) -> None:
        """Deliver the messages of ``topic`` to ``callback(data, publisher host)`` of subscriber ``host``."""
        self.subscribers.setdefault(topic, {})[host] = callback

    def unsubscribe(self, topic: str, host: str) -> None:
        """Stop delivering ``topic`` to ``host``."""
        self.subscribers.get(topic, {}).pop(host, None)

    def announcer(self, host: str, topics: Any) -> Any:
        """An ``announce(data)`` coroutine function for a publisher whose libp2p id is ``host``, publishing on the
        topics ``topics()`` returns (what :meth:`swarm.gossip.Gossip.announce` does over p2pd)."""

        async def announce(data: bytes) -> bool:
            for topic in topics():
                for subscriber, callback in list(self.subscribers.get(topic, {}).items()):
                    self.delivered[subscriber] += 1
                    self.delivered_bytes[subscriber] += len(data)
                    callback(data, host)
            return True

        return announce
