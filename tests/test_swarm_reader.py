"""The DHT transport's publisher and reader on an injected clock and a dictionary DHT, without p2pd: what a peer
takes from the swarm, when it expires, and what a wrong clock costs."""

from __future__ import annotations

import asyncio
import base64
import random
from collections import Counter
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest
from hivemind.utils import ValueWithExpiration
from hivemind.utils.crypto import RSAPrivateKey

from swarm.clock import ManualClock
from swarm.config import DHTTransportConfig
from swarm.levels import probe_levels, read_level_for, shards_per_read, write_levels_for
from swarm.memory import DictDHT
from swarm.publisher import SwarmPublisher
from swarm.reader import SwarmReader
from swarm.served import MemoryServedLookup, ServedRecords, SignedRecord
from swarm.transport import SwarmCounters, TimingLog
from swarm.validation import (
    RejectionLog,
    fingerprint,
    index_key_of,
    index_keys,
    make_record_validator,
    owner_marker,
    record_key,
)
from tests.swarm_fixtures import make_group

_RUNNER: asyncio.Runner | None = None


@pytest.fixture(scope="module", autouse=True)
def _event_loop() -> Iterator[None]:
    global _RUNNER
    with asyncio.Runner() as runner:
        _RUNNER = runner
        yield
    _RUNNER = None


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to its end on this module's event loop: one loop for every step, since a fresh one per step (as
    ``asyncio.run`` makes) was most of the large swarms' time."""
    return _RUNNER.run(coro)


class Peer:
    """One peer's publisher and reader on a shared DictDHT and its own clock; with ``hosts`` (every serving peer's
    records by host, an in-memory stand-in for libp2p), it serves its records and fetches served ones. Without
    announcements (``gossip`` False unless given): readers find records through the index, as these tests check."""

    def __init__(self, dht: DictDHT, clock: ManualClock, hosts: dict[str, ServedRecords] | None = None, **config: Any):
        self.config = DHTTransportConfig(**{"gossip": False, **config})
        private_key = RSAPrivateKey()
        self.public_key = private_key.get_public_key().to_bytes()
        self.peer_id = fingerprint(self.public_key)
        self.counters = SwarmCounters()
        self.timings = timings = TimingLog(clock)
        self.served = self.lookup = None
        if hosts is not None:
            validator = make_record_validator(
                private_key, self.config.swarm_name, self.config.index_shards, self.config.limits,
                RejectionLog(self.counters), index_max_level=self.config.index_max_level,
            )  # fmt: skip
            self.served = ServedRecords(validator, self.config.index_records, self.counters, clock)
            self.served.host = f"host-of-{self.peer_id}"
            hosts[self.served.host] = self.served
            self.lookup = MemoryServedLookup(validator, hosts)
        self.reader = SwarmReader(
            self.config, self.public_key, self.counters, timings, clock, random.Random(0), served=self.lookup
        )
        self.publisher = SwarmPublisher(  # wired as DHTTransport wires them
            self.config, self.public_key, self.counters, timings, clock, write_levels=self.reader.write_levels,
            served=self.served,
        )  # fmt: skip
        self.dht = dht

    def publish(self, *group_ids: str, created_at: float, **group: Any) -> None:
        self.publisher.queue([make_group(g, created_at=created_at, **group) for g in group_ids])
        run(self.publisher.flush(self.dht))

    def poll(self) -> None:
        run(self.reader.poll(self.dht))


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


def test_senders_dated_ahead_are_warned_of_at_most_once_a_minute_however_many_identities(caplog):
    """Identities are free: a warning line for each sender dated ahead would let one peer write the node's log full.
    Twelve identities ahead make one line naming the first and, a minute later, one counting the others."""
    dht, clock, fast_clock = DictDHT(), ManualClock(), ManualClock()
    fast_clock.advance(10)
    reader = Peer(dht, clock, index_shards_per_poll=0)
    for n in range(12):
        Peer(dht, fast_clock, index_shards_per_poll=0).publish(f"future-{n}", created_at=fast_clock.time())
    with caplog.at_level("WARNING", logger="swarm.reader"):
        run(reader.reader.read_index(dht))
        lines = [r.getMessage() for r in caplog.records if r.name == "swarm.reader" and "future" in r.getMessage()]
        assert len(lines) == 1 and "other senders" not in lines[0], lines
        assert reader.counters.snapshot()["rejected/clock_skew"] == 12
        clock.advance(61)
        fast_clock.advance(61)
        Peer(dht, fast_clock, index_shards_per_poll=0).publish("late", created_at=fast_clock.time())
        run(reader.reader.read_index(dht))
    lines = [r.getMessage() for r in caplog.records if r.name == "swarm.reader" and "future" in r.getMessage()]
    assert len(lines) == 2 and "(and 11 more such line(s) left out since the last one)" in lines[1], lines


def test_fresh_identities_found_make_ten_lines_a_minute_and_the_next_one_counts_the_rest(caplog):
    """A line for each sender found let one peer making fresh identities fill the node's log (and rotate its history
    away); 25 found at once make 10 lines, and the first a minute later counts the 15 left out."""
    from swarm.log_lines import PEER_LINES_BURST, PEER_LINES_EVERY

    dht, clock = DictDHT(), ManualClock()
    reader = Peer(dht, clock, index_shards_per_poll=0)
    for n in range(25):
        Peer(dht, clock, index_shards_per_poll=0).publish(f"g{n}", created_at=clock.time())
    with caplog.at_level("INFO", logger="swarm.reader"):
        run(reader.reader.read_index(dht))
        assert len(reader.reader.book.senders()) == 25  # every one is taken: only the lines are bounded
        clock.advance(PEER_LINES_EVERY)
        Peer(dht, clock, index_shards_per_poll=0).publish("late", created_at=clock.time())
        run(reader.reader.read_index(dht))
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "swarm.reader" and " found key fingerprint " in r.getMessage()
    ]
    assert len(lines) == PEER_LINES_BURST + 1, lines
    assert lines[-1].endswith("(and 15 more such line(s) left out since the last one)")


def test_a_poll_reads_a_few_index_shards_in_rotation_and_fetches_only_what_the_cache_lacks():
    dht, clock = DictDHT(), ManualClock()
    reader = Peer(  # one level: the rotation over level 0's shards (levels: the large-swarm tests below)
        dht, clock, index_shards_per_poll=2, index_shard_entries=1, prefetch_groups=2, index_min_interval=0,
        index_max_level=0,
    )  # fmt: skip
    rng = random.Random(4)
    writers = [Writer(dht, clock, rng) for _ in range(16)]  # about two entries per shard, one wanted
    for n, writer in enumerate(writers):
        writer.publish(f"w{n}a", f"w{n}b", created_at=clock.time())
    for _ in range(2):  # the first read probes two shards; the next ones read two, as the estimate says
        reader.poll()
        reader.reader.take(100)
    assert [len(keys) for keys in dht.reads if "/index/" in keys[0]] == [2, 2]
    shards_read: list[str] = []
    for _ in range(4):  # four polls of two shards: every shard once
        dht.reads.clear()
        reader.poll()
        shards_read += [key for keys in dht.reads for key in keys if "/index/" in key]
        reader.reader.take(100)  # empty the cache so that every poll fetches
    assert sorted(shards_read) == sorted(f"{reader.config.swarm_name}/index/{i}" for i in range(8))
    for n, writer in enumerate(writers):  # a new record each, listed by the index
        writer.publish(f"w{n}c", f"w{n}d", created_at=clock.time())
    for _ in range(4):  # every shard once: the reader knows them all
        run(reader.reader.read_index(dht))
    dht.reads.clear()
    reader.reader.take(2)
    reader.reader.take(2)  # the caller now takes 2 groups per step
    reader.poll()  # the next take wants 2 groups: two records of 2 groups are fetched, not all sixteen
    record_keys = [key for keys in dht.reads for key in keys if "/records/" in key]
    assert len(record_keys) == 2  # one sender's record covers at most half a refill (refill_sender_share)


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


class Writer:
    """A publisher alone (no reader), with random bytes for a public key: RSA keys for hundreds of peers are slow."""

    def __init__(self, dht: DictDHT, clock: ManualClock, rng: random.Random, write_levels: Any = None, **config: Any):
        self.config = DHTTransportConfig(**config)
        self.public_key = b"ssh-rsa " + base64.b64encode(rng.randbytes(279))
        self.peer_id = fingerprint(self.public_key)
        self.counters = SwarmCounters()
        self.publisher = SwarmPublisher(
            self.config, self.public_key, self.counters, TimingLog(clock), clock, write_levels=write_levels
        )
        self.dht = dht

    def publish(self, *group_ids: str, created_at: float) -> None:
        self.publisher.queue([make_group(g, created_at=created_at) for g in group_ids])
        run(self.publisher.flush(self.dht))


def _index_reads(dht: DictDHT) -> list[list[str]]:
    return [keys for keys in dht.reads if any("/index/" in key for key in keys)]


def _entries_in(dht: DictDHT, keys: list[str]) -> int:
    return sum(len(dht.items.get(key, {})) for key in keys)


def test_in_a_large_swarm_an_index_read_returns_a_bounded_number_of_entries_and_groups_come_from_many_senders():
    dht, clock, rng = DictDHT(), ManualClock(), random.Random(1)
    reader = Peer(dht, clock, prefetch_groups=4, index_min_interval=0)
    writers = [Writer(dht, clock, rng, write_levels=reader.reader.write_levels) for _ in range(512)]
    entries_per_read, senders, ages = [], Counter(), []
    for step in range(30):
        for n, writer in enumerate(writers):  # every writer publishes once per step
            writer.publish(f"{n}-{step}", created_at=clock.time())
        clock.advance(15)
        dht.reads.clear()
        reader.poll()
        entries_per_read += [_entries_in(dht, keys) for keys in _index_reads(dht)]
        taken = reader.reader.take(4)
        senders.update(item.sender for item in taken)
        ages += [clock.time() - item.group.created_at for item in taken]
        clock.advance(15)
    level_0_shard = _entries_in(dht, index_keys("sapo", 8)[:1])
    assert level_0_shard > 40  # reading level 0 would return ~64 entries per shard, 128 per read
    settled = entries_per_read[10:]  # after the first reads (the probe, level 0 while the estimate forms)
    assert max(settled) <= 16 and sum(settled) / len(settled) <= 8, entries_per_read
    assert 256 <= reader.reader.estimated_peers() <= 1024
    assert reader.reader.read_level() in (4, 5, 6)  # 512 / (8 * 2**5) = 2 entries per shard
    assert sum(senders.values()) >= 4 * 29  # the cache is kept filled
    assert len(senders) >= 40 and max(senders.values()) <= 8, senders  # spread over many senders
    assert sorted(ages)[len(ages) // 2] <= 30  # the groups taken are fresh: published within the last step or two


def _writers_once_the_estimate_formed(count: int, seed: int) -> tuple[DictDHT, ManualClock, Peer, list[Writer]]:
    """``count`` writers wired to one neighbour's estimate of the swarm's size: each publishes once before the
    estimate forms (every level), then, the DHT emptied, once after; the DHT holds the second round only."""
    dht, clock, rng = DictDHT(), ManualClock(), random.Random(seed)
    neighbour = Peer(dht, clock, index_min_interval=0)
    writers = [Writer(dht, clock, rng, write_levels=neighbour.reader.write_levels) for _ in range(count)]
    for n, writer in enumerate(writers):
        writer.publish(f"first-{n}", created_at=clock.time())
    for _ in range(12):
        neighbour.poll()
        clock.advance(3)
    dht.items.clear()
    for n, writer in enumerate(writers):
        writer.publish(f"second-{n}", created_at=clock.time())
    return dht, clock, neighbour, writers


def test_a_writer_is_listed_at_every_level_a_reader_of_its_swarm_size_reads():
    dht, clock, neighbour, writers = _writers_once_the_estimate_formed(300, seed=2)
    stores = writers[0].counters.snapshot()["index_stores"] - 11  # the first publication: all 11 levels
    assert stores == 3  # a window of levels around the read level, not all 11
    config = neighbour.config
    written_for = neighbour.reader.estimated_peers()  # the estimate the writers' levels follow: about 300
    assert 150 <= written_for <= 600
    for estimate in (written_for / 2, written_for, 2 * written_for):  # readers estimating half to twice as many
        level = read_level_for(estimate, config)
        for writer in writers:
            key = index_key_of(config.swarm_name, config.index_shards, level, writer.peer_id)
            assert owner_marker(writer.public_key) in dht.items.get(key, {}), (estimate, level)


def test_a_large_swarm_leaves_the_low_levels_empty_and_a_newcomer_still_finds_it_by_probing():
    dht, clock, _, _ = _writers_once_the_estimate_formed(2000, seed=5)
    # a store's shards stay small: nobody writes the levels whose shards would list hundreds of peers
    assert not any(key in dht.items for level in (0, 1, 2) for key in index_keys("sapo", 8, level))
    assert max(len(dht.items[key]) for key in dht.items if "/index/" in key) <= 40
    newcomer = Peer(dht, clock, index_min_interval=0)
    reads = 0
    while not newcomer.reader.peers() and reads < 10:
        newcomer.poll()  # its first read probes the middle level, then level 0, 2, 8, 10 in turn
        clock.advance(3)
        reads += 1
    assert newcomer.reader.peers() and reads <= 5, reads
    for _ in range(12):
        newcomer.poll()
        clock.advance(3)
    assert 1000 <= newcomer.reader.estimated_peers() <= 4000


def test_write_levels_cover_the_read_level_of_any_reader_estimating_from_half_to_twice_as_many_peers():
    for entries in (1, 2, 4, 16):
        config = DHTTransportConfig(index_shard_entries=entries)
        for estimate in [0.0, 1.0, 3.0] + [1.3**k for k in range(5, 50)]:
            levels = write_levels_for(estimate, config)
            for reader_estimate in (estimate / 2, estimate, 2 * estimate):
                assert read_level_for(reader_estimate, config) in levels, (entries, estimate, reader_estimate)
            # a reader whose reads found nothing probes until it hits one of them, whatever the swarm's size
            assert set(probe_levels(config)) & set(levels), (entries, estimate)
            if entries == 2 and estimate <= 16384:  # the default, within its 10 levels: at most 3 levels written,
                assert len(levels) <= 3 and estimate / (config.index_shards << levels[0]) <= 16, levels  # small shards
        assert write_levels_for(None, config) == range(config.index_max_level + 1)  # no estimate: every level
    assert probe_levels(DHTTransportConfig()) == [5, 0, 2, 8, 10]
    config = DHTTransportConfig()
    assert [read_level_for(n, config) for n in (8, 64, 512, 2048, 16384, 10**6)] == [0, 2, 5, 7, 10, 10]
    assert read_level_for(None, config) == 5 and read_level_for(None, DHTTransportConfig(index_shards_per_poll=0)) == 0
    # a read returns about 2 shards * 2 entries: more shards of level 0 while the swarm cannot fill them
    assert [shards_per_read(n, read_level_for(n, config), config) for n in (0, 2, 8, 16, 64, 512, 10**6)] == [
        8, 8, 4, 2, 2, 2, 2,
    ]  # fmt: skip
    assert shards_per_read(512, 0, DHTTransportConfig(index_shards_per_poll=0)) == 8
    assert shards_per_read(None, read_level_for(None, config), config) == 2  # the first read: a probe of 2 shards


def test_index_entries_of_departed_peers_expire_with_the_peers_at_every_level():
    clock, rng = ManualClock(), random.Random(3)
    dht = DictDHT(clock)  # values expire, as in hivemind
    reader = Peer(dht, clock, index_min_interval=0, index_refresh_interval=0, record_ttl=600)
    writers = [Writer(dht, clock, rng, record_ttl=600) for _ in range(200)]  # every level
    for n, writer in enumerate(writers):
        writer.publish(f"old-{n}", created_at=clock.time())
    for _ in range(10):
        reader.poll()
        clock.advance(1)
    assert reader.reader.peers() and reader.reader.read_level() >= 2
    clock.advance(610)
    reader.reader.forget_expired()
    assert reader.reader.peers() == [] and reader.reader.take(100) == []
    newcomer = Writer(dht, clock, rng)
    newcomer.publish("new", created_at=clock.time())
    got = []
    for _ in range(200):  # the rotation reaches the newcomer's shard at the level read
        reader.poll()
        got += reader.reader.take(100)
        if any(item.sender == newcomer.peer_id for item in got):
            break
        clock.advance(1)
    assert [item.group.group_id for item in got] == ["new"]  # nothing of the departed peers
    assert reader.reader.read_level() == 0  # their entries expired: the estimate fell with them


def _serving_pair(clock: ManualClock) -> tuple[DictDHT, dict[str, ServedRecords], Peer, Peer]:
    dht, hosts = DictDHT(), {}
    a = Peer(dht, clock, hosts, index_shards_per_poll=0)
    b = Peer(dht, clock, hosts, index_shards_per_poll=0)
    return dht, hosts, a, b


def test_served_records_are_fetched_from_their_publisher_and_only_the_index_is_in_the_dht():
    clock = ManualClock()
    dht, hosts, a, b = _serving_pair(clock)
    a.publish("a1", "a2", created_at=clock.time())
    assert all(key.split("/")[1] == "index" for key in dht.items)  # no record was sent to the DHT
    b.poll()
    assert sorted(item.group.group_id for item in b.reader.take(10)) == ["a1", "a2"]
    assert a.counters.snapshot()["served_requests"] == 1 and a.counters.snapshot()["published_records"] == 1
    assert b.lookup.bytes_read > 2 * 4 * 64  # the record's two groups crossed "the network" once


def test_a_served_record_that_was_tampered_with_or_is_no_record_is_rejected_and_counted():
    clock = ManualClock()
    _, hosts, a, b = _serving_pair(clock)
    a.publish("a1", created_at=clock.time())
    [ref] = a.publisher.recent_refs()
    key = record_key(a.config.swarm_name, a.peer_id, ref.seq)
    signed = a.served.get(key)
    # a relay or the host itself changes the bytes after signing: the owner's signature no longer matches
    a.served.put(key, SignedRecord(signed.value.replace(b"answer a1", b"answer XX"), signed.expiration_time))
    b.poll()
    assert b.reader.take(10) == [] and b.counters.snapshot()["rejected/bad_signature"] == 1
    a.publish("a2", created_at=clock.time())
    # a host answering bytes that are no record at all
    hosts[a.served.host].handle = _answer_with(b"\xc1 not msgpack")
    clock.advance(5)
    b.poll()
    assert b.reader.take(10) == [] and b.counters.snapshot()["rejected/not_msgpack"] == 1


def _answer_with(data: bytes) -> Any:
    from google.protobuf.wrappers_pb2 import BytesValue

    async def handle(request: Any, context: Any = None) -> Any:
        return BytesValue(value=data)

    return handle


def test_a_record_whose_publisher_is_gone_is_given_up_after_a_few_polls():
    clock = ManualClock()
    _, hosts, a, b = _serving_pair(clock)
    a.publish("a1", created_at=clock.time())
    del hosts[a.served.host]  # a left before b fetched its record
    b.poll()
    assert b.counters.snapshot()["fetch_failures"] == 1
    for _ in range(5):  # a host that failed rests: not asked again at every poll
        clock.advance(5)
        b.poll()
    assert b.counters.snapshot()["fetch_failures"] == 1 and b.reader.choose_refs(1) == []
    for _ in range(3):  # asked again once each rest is over, then given up
        clock.advance(31)
        b.poll()
    counters = b.counters.snapshot()
    assert counters["fetch_failures"] == 3 and counters["records_missing"] == 1
    clock.advance(31)
    assert b.reader.choose_refs(1) == []  # given up: never asked for again


def test_a_publisher_that_did_not_answer_is_asked_again_once_it_writes_a_fresh_index_entry():
    clock = ManualClock()
    _, hosts, a, b = _serving_pair(clock)
    a.publish("a1", created_at=clock.time())
    served = hosts.pop(a.served.host)  # a is cut off: b's request fails and a rests
    b.poll()
    assert b.counters.snapshot()["fetch_failures"] == 1 and b.reader.choose_refs(1) == []
    hosts[a.served.host] = served  # the link is back, and a publishes again: its entry is newer than the failure
    clock.advance(5)
    a.publish("a2", created_at=clock.time())
    b.poll()
    assert sorted(item.group.group_id for item in b.reader.take(10)) == ["a1", "a2"]  # within the 30 s rest


def test_a_prior_from_fewer_neighbours_than_a_bucket_holds_is_at_most_twice_the_nodes_known():
    from swarm.levels import size_from_distances, topic_level_for

    config = DHTTransportConfig()
    space = 1 << 160
    close = [space // 80, space // 50]  # two neighbours close by: the fit alone says about 95 peers
    assert size_from_distances(close, nearest=2) > 50  # as many as a bucket holds (a large DHT): the fit as it is
    prior = size_from_distances(close, nearest=config.dht_bucket_size)
    assert prior == 6.0 and topic_level_for(prior, config) == 0  # three nodes known: one topic, as every peer's
    rng = random.Random(3)
    ids = [rng.getrandbits(160) for _ in range(400)]  # a DHT larger than a bucket: its nearest fit N's order
    estimate = size_from_distances([ids[0] ^ other for other in ids[1:]], config.dht_bucket_size)
    assert 100 <= estimate <= 1600
    assert size_from_distances([space // 3], nearest=config.dht_bucket_size) is None


def test_a_reader_whose_prior_is_far_off_finds_a_small_swarm_by_probing_outside_its_topic():
    from swarm.levels import home_topic_shard, topic_index_shards, topic_level_for
    from swarm.validation import index_shard_of

    dht, clock, rng = DictDHT(), ManualClock(), random.Random(4)
    config = DHTTransportConfig(announce=False, subscribe_topics=0, index_min_interval=0)  # a watcher, as observers
    key = RSAPrivateKey().get_public_key().to_bytes()
    # its prior says 1000 peers: topic level 7, whose index shards at level 0 are one of level 0's eight
    wrong_level = topic_level_for(1000.0, config)
    topic_shards = topic_index_shards(home_topic_shard(fingerprint(key), wrong_level), wrong_level, 0, config)
    writers: list[Writer] = []
    while len(writers) < 2:  # a swarm of two whose entries lie outside that topic's shards
        writer = Writer(dht, clock, rng, write_levels=lambda: range(0, 2))
        if index_shard_of(writer.peer_id, config.index_shards, 0) not in topic_shards:
            writers.append(writer)
    for n, writer in enumerate(writers):
        writer.publish(f"w{n}", created_at=clock.time())
    reader = SwarmReader(config, key, SwarmCounters(), TimingLog(clock), clock, rng, prior=lambda: 1000.0)
    for _ in range(8):
        run(reader.poll(dht))
        clock.advance(3)
    assert {p.peer for p in reader.peers()} == {w.peer_id for w in writers}
    assert reader.estimated_peers() is not None and reader.estimated_peers() <= 4 and reader.topic_level() == 0


def test_probes_read_every_shard_of_a_level_in_turn_so_a_writer_whose_prior_is_far_off_is_found():
    # Two peers of a new swarm whose priors both said about 100 peers: each writes levels 2-4 only and reads nothing
    # there, so it probes. Probes of one level took turns with the others' shards: level 2's rotation moved by the
    # other levels' reads (16 shards a cycle of 32), so only 4 of its 32 shards were ever read and a writer on
    # another shard was never found (two nodes waited 300 s for each other).
    from swarm.validation import index_shard_of

    dht, clock, rng = DictDHT(), ManualClock(), random.Random(7)
    config = DHTTransportConfig(gossip=False, index_min_interval=0)
    prior = 100.0
    levels = write_levels_for(prior, config)
    assert list(levels) == [2, 3, 4] and 0 not in levels  # level 0, read whole after an empty read, is not written
    key = RSAPrivateKey().get_public_key().to_bytes()
    for trial in range(4):  # writers on four different shards of level 2
        writer = Writer(dht, clock, rng, write_levels=lambda: levels)
        writer.publish(f"t{trial}", created_at=clock.time())
        counters, timings, rotation = SwarmCounters(), TimingLog(clock), random.Random(trial)
        reader = SwarmReader(config, key, counters, timings, clock, rotation, prior=lambda: prior)
        probes = len(probe_levels(config))
        shards = config.index_shards << 2
        reads = 0
        while not reader.peers() and reads < 2 * probes * shards:
            run(reader.poll(dht))
            clock.advance(1)
            reads += 1
        # level 2 comes once a round of probes, read two shards at a time: every shard within half its count
        shard = index_shard_of(writer.peer_id, config.index_shards, 2)
        assert reader.peers() and reads <= probes * (shards // 2) + 1, (trial, shard, reads)
        dht.items.clear()


def _from(items, peer: Peer) -> list[str]:
    return [item.group.group_id for item in items if item.sender == peer.peer_id]


def test_a_sender_whose_records_truly_hold_many_groups_dated_ahead_takes_only_its_share():
    """An attacker's record holds 16 real groups dated 2 s ahead (within the clock tolerance): before the fair take,
    the reader handed out the freshest groups whoever sent them, so the attacker's filled every take, while its 16
    cached groups told the refill nothing more was wanted."""
    dht, clock = DictDHT(), ManualClock()
    reader = Peer(dht, clock, index_shards_per_poll=0)
    attacker, honest = Peer(dht, clock, index_shards_per_poll=0), Peer(dht, clock, index_shards_per_poll=0)
    honest.publish("h1", "h2", "h3", created_at=clock.time() - 5)
    attacker.publish(*[f"a{i}" for i in range(16)], created_at=clock.time() + 2)
    reader.poll()
    assert reader.reader.cached_groups() == 19
    taken = reader.reader.take(4)
    assert len(_from(taken, honest)) == 2 and len(_from(taken, attacker)) == 2  # each sender its share: half
    assert [item.group.created_at for item in taken] == sorted((i.group.created_at for i in taken), reverse=True)
    # A sender judged good has a share of its own; the unjudged attacker shares the pool (a quarter of 4: one).
    for _ in range(3):
        reader.reader.book.judge(honest.peer_id, True)
    clock.advance(30)  # the next index read is due
    honest.publish("h4", "h5", created_at=clock.time() - 1)
    reader.poll()
    taken = reader.reader.take(4)
    assert sorted(_from(taken, honest)) == ["h3", "h4", "h5"] and len(_from(taken, attacker)) == 1
    # Work-conserving: with nobody else's groups left, the attacker's fill the take.
    assert len(_from(reader.reader.take(4), attacker)) == 4


def test_one_senders_many_groups_count_for_its_share_of_a_refill_and_are_evicted_first():
    dht, clock = DictDHT(), ManualClock()
    reader = Peer(dht, clock, index_shards_per_poll=0, max_cached_groups=8, prefetch_groups=4)
    attacker, honest = Peer(dht, clock, index_shards_per_poll=0), Peer(dht, clock, index_shards_per_poll=0)
    honest.publish("h1", "h2", created_at=clock.time() - 5)
    attacker.publish(*[f"a{i}" for i in range(12)], created_at=clock.time() + 2)
    reader.poll()
    # 14 fetched, 8 kept: the six evicted are the attacker's (the sender holding the most), its oldest first
    assert reader.reader.cached_groups() == 8
    held = reader.reader.take(8)
    assert sorted(_from(held, honest)) == ["h1", "h2"] and len(_from(held, attacker)) == 6
    # Before the caller's pace is known the refill wants prefetch_groups (4) less the cache, each sender's groups
    # counting for at most half of it: 12 groups of one sender count as 2, and 2 groups are still wanted.
    clock.advance(30)
    attacker.publish(*[f"b{i}" for i in range(12)], created_at=clock.time() + 2)
    reader.poll()
    assert reader.reader.cached_groups() == 8 and reader.reader.wanted() == 2


def test_one_senders_large_groups_are_evicted_first_when_the_cache_holds_too_much_text():
    """A group may hold 64 completions of 32,768 characters: counted in groups alone, the cache (256) could hold half
    a gigabyte of one sender's text. Past `max_cached_chars` the oldest groups of the sender holding the most text go,
    the small groups of others kept."""
    dht, clock = DictDHT(), ManualClock()
    reader = Peer(dht, clock, index_shards_per_poll=0, max_cached_chars=300_000)
    attacker, honest = Peer(dht, clock, index_shards_per_poll=0), Peer(dht, clock, index_shards_per_poll=0)
    honest.publish("h1", "h2", created_at=clock.time() - 5)
    attacker.publish("a1", "a2", created_at=clock.time() - 5, completion_chars=32_768, completions=4)
    attacker.publish("a3", "a4", created_at=clock.time(), completion_chars=32_768, completions=4)
    reader.poll()
    # 4 groups of 131 K characters and 2 small ones: 525 K characters, 300 K kept: the attacker's two oldest go
    held = reader.reader.take(8)
    assert sorted(_from(held, honest)) == ["h1", "h2"] and sorted(_from(held, attacker)) == ["a3", "a4"]
    assert reader.reader.cached_groups() == 0


def test_what_a_reader_keeps_of_each_group_it_handed_out_does_not_grow_with_the_senders_group_id():
    """A reader remembers the groups it handed out (up to 100,000) so that a record fetched twice is not trained on
    twice. A group id is the sender's to choose, up to `max_field_chars` (1024 characters), and the reader kept each
    id whole: 121 MiB at the bound with such ids. What it keeps once the groups are gone is now the same for ids of 8
    and of 1024 characters."""
    import gc
    import tracemalloc

    def kept_after_taking(id_chars: int, groups: int = 200) -> int:
        dht, clock = DictDHT(), ManualClock()
        a, b = Peer(dht, clock, index_shards_per_poll=0), Peer(dht, clock, index_shards_per_poll=0)
        gc.collect()
        tracemalloc.start()
        try:
            taken = 0
            for first in range(0, groups, 10):  # a record of 10 groups a second, each read before the next
                a.publish(*(f"{n:0{id_chars}d}" for n in range(first, first + 10)), created_at=clock.time())
                b.poll()
                taken += len(b.reader.take(100))
                clock.advance(1)
            b.poll()
            taken += len(b.reader.take(100))
            assert taken == groups
            del a, dht  # the sender and its records gone: what is left is what the reader keeps
            b.dht = None
            gc.collect()
            return tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()

    short, long = kept_after_taking(8), kept_after_taking(1024)
    assert long - short < 200 * 100, (short, long)  # kept whole, the 200 ids of 1024 characters held 200 KB more
