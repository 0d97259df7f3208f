"""The DHT transport's publisher and reader on an injected clock and a dictionary DHT, without p2pd: what a peer
takes from the swarm, when it expires, and what a wrong clock costs."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from hivemind.utils import ValueWithExpiration
from hivemind.utils.crypto import RSAPrivateKey

from swarm.clock import ManualClock
from swarm.config import DHTTransportConfig
from swarm.memory import DictDHT
from swarm.publisher import SwarmPublisher
from swarm.reader import SwarmReader
from swarm.transport import SwarmCounters, TimingLog
from swarm.validation import fingerprint, owner_marker
from tests.swarm_fixtures import make_group


class Peer:
    """One peer's publisher and reader on a shared DictDHT and its own clock."""

    def __init__(self, dht: DictDHT, clock: ManualClock, **config: Any):
        self.config = DHTTransportConfig(**config)
        self.public_key = RSAPrivateKey().get_public_key().to_bytes()
        self.peer_id = fingerprint(self.public_key)
        self.counters = SwarmCounters()
        self.timings = timings = TimingLog(clock)
        self.publisher = SwarmPublisher(self.config, self.public_key, self.counters, timings, clock)
        self.reader = SwarmReader(self.config, self.public_key, self.counters, timings, clock, random.Random(0))
        self.dht = dht

    def publish(self, *group_ids: str, created_at: float) -> None:
        self.publisher.queue([make_group(g, created_at=created_at) for g in group_ids])
        asyncio.run(self.publisher.flush(self.dht))

    def poll(self) -> None:
        asyncio.run(self.reader.poll(self.dht))


def test_a_reader_takes_each_published_group_once_and_lists_its_sender():
    dht, clock = DictDHT(), ManualClock()
    a, b = Peer(dht, clock, index_shards_per_poll=0), Peer(dht, clock, index_shards_per_poll=0)
    a.publish("a1", "a2", created_at=clock.time())
    b.poll()
    assert [p.peer for p in b.reader.peers()] == [a.peer_id]
    taken = b.reader.take(10)
    assert sorted(item.group.group_id for item in taken) == ["a1", "a2"]
    assert {item.sender for item in taken} == {a.peer_id}
    clock.advance(30)
    b.poll()
    assert b.reader.take(10) == []  # the same record is not fetched and handed out again
    assert a.reader.take(10) == [] and a.reader.peers() == []  # a peer never takes its own groups
    assert b.counters.snapshot()["fetched_groups"] == 2


def test_delivery_latency_is_the_time_from_publication_to_the_cache():
    dht, clock = DictDHT(), ManualClock()
    a, b = Peer(dht, clock, index_shards_per_poll=0), Peer(dht, clock, index_shards_per_poll=0)
    a.publish("a1", created_at=clock.time())
    clock.advance(2.5)  # the store travels, the reader polls later
    b.poll()
    delivery = b.timings.snapshot()["delivery"]
    assert [seconds for _, seconds in delivery] == [2.5]


def test_groups_and_peers_expire_on_the_clock():
    dht, clock = DictDHT(), ManualClock()
    a, b = Peer(dht, clock, record_ttl=600, index_shards_per_poll=0), Peer(dht, clock, index_shards_per_poll=0)
    a.publish("old", created_at=clock.time())
    b.poll()
    clock.advance(610)  # beyond the ttl and the clock tolerance
    assert b.reader.take(10) == []  # cached, but older than the record ttl when asked for
    assert b.counters.snapshot()["rejected/expired"] == 1
    assert b.reader.peers() == []  # silent for longer than the record ttl: no longer listed
    a.publish("new", created_at=clock.time())
    clock.advance(1)
    b.poll()
    assert [item.group.group_id for item in b.reader.take(10)] == ["new"]
    assert b.reader.gauges()["seen_refs"] == 1  # the expired record's bookkeeping was forgotten


def test_a_peer_whose_clock_runs_ahead_is_rejected_as_clock_skew():
    dht, clock, fast_clock = DictDHT(), ManualClock(), ManualClock()
    fast_clock.advance(10)  # ten seconds ahead: beyond the 3 s tolerance
    ahead = Peer(dht, fast_clock, index_shards_per_poll=0)
    b = Peer(dht, clock, index_shards_per_poll=0)
    ahead.publish("future", created_at=fast_clock.time())
    b.poll()
    assert b.reader.take(10) == [] and b.reader.peers() == []
    assert b.counters.snapshot()["rejected/clock_skew"] >= 1


def test_a_poll_reads_a_few_index_shards_in_rotation_and_fetches_only_what_the_cache_lacks():
    dht, clock = DictDHT(), ManualClock()
    reader = Peer(dht, clock, index_shards=8, index_shards_per_poll=2, prefetch_groups=2, index_min_interval=0)
    writers = [Peer(dht, clock) for _ in range(6)]
    for n, writer in enumerate(writers):
        writer.publish(f"w{n}a", f"w{n}b", created_at=clock.time())
    shards_read: list[str] = []
    for _ in range(4):  # four polls of two shards: every shard once
        dht.reads.clear()
        reader.poll()
        shards_read += [key for keys in dht.reads for key in keys if "/index/" in key]
        reader.reader.take(100)  # empty the cache so that every poll fetches
    assert sorted(shards_read) == sorted(f"{reader.config.swarm_name}/index/{i}" for i in range(8))
    dht.reads.clear()
    reader.poll()  # the cache wants 2 groups: one record of 2 groups is fetched, not all six
    record_keys = [key for keys in dht.reads for key in keys if "/records/" in key]
    assert len(record_keys) == 1


def test_a_refused_index_entry_is_counted_once_not_at_every_read():
    dht, clock = DictDHT(), ManualClock()
    reader = Peer(dht, clock, index_shards=1, index_shards_per_poll=0, index_min_interval=0, index_refresh_interval=0)
    liar_key = RSAPrivateKey().get_public_key().to_bytes()
    shard = f"{reader.config.swarm_name}/index/0"
    dht.items[shard] = {owner_marker(liar_key): ValueWithExpiration(b"not an index entry", clock.time() + 600)}
    for _ in range(3):
        reader.poll()
        clock.advance(1)
    rejected = {k: v for k, v in reader.counters.snapshot().items() if k.startswith("rejected/")}
    assert sum(rejected.values()) == 1, rejected
