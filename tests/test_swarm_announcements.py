"""Announcements, freshest-first intake, refills just in time, departures and hedged fetches: the real publisher and
reader on an injected clock, a dictionary DHT and in-memory topics (swarm.memory), without p2pd."""

from __future__ import annotations

import asyncio
import base64
import random
from typing import Any

import msgpack
import pytest
from hivemind.utils.crypto import RSAPrivateKey

from swarm.announcements import (
    AnnouncedRecord,
    Announcement,
    decode_announcement,
    encode_announcement,
    record_digest,
    signed_bytes,
)
from swarm.clock import ManualClock
from swarm.config import DHTTransportConfig
from swarm.levels import publish_topics, subscribe_topics
from swarm.memory import DictDHT, MemoryPubsub
from swarm.publisher import SwarmPublisher
from swarm.reader import SwarmReader
from swarm.records import IndexEntry, RecordLimits, RecordRef, RecordRejected
from swarm.senders import SenderBook
from swarm.served import MemoryServedLookup, ServedRecords
from swarm.transport import SwarmCounters, TimingLog
from swarm.validation import RejectionLog, fingerprint, make_record_validator
from tests.swarm_fixtures import make_group

KEY = RSAPrivateKey()


class Net:
    """What peers share: the DHT, the served records by host, the topics and the clock."""

    def __init__(self) -> None:
        self.dht, self.hosts, self.pubsub, self.clock = DictDHT(), {}, MemoryPubsub(), ManualClock()


class Peer:
    """One peer's publisher and reader wired as DHTTransport wires them, announcing on in-memory topics."""

    def __init__(self, net: Net, key: RSAPrivateKey | None = None, admits: Any = None, **config: Any):
        self.net = net
        self.config = DHTTransportConfig(**{"index_refresh_interval": 3600.0, **config})
        self.key = key or RSAPrivateKey()
        self.public_key = self.key.get_public_key().to_bytes()
        self.peer_id = fingerprint(self.public_key)
        self.counters = SwarmCounters()
        validator = make_record_validator(
            self.key, self.config.swarm_name, self.config.index_shards, self.config.limits,
            RejectionLog(self.counters), index_max_level=self.config.index_max_level,
        )  # fmt: skip
        self.served = ServedRecords(validator, 16, self.counters, net.clock)
        self.served.host = f"host-of-{self.peer_id}"
        net.hosts[self.served.host] = self.served
        self.lookup = MemoryServedLookup(validator, net.hosts)
        self.reader = SwarmReader(
            self.config, self.public_key, self.counters, TimingLog(net.clock), net.clock, random.Random(0),
            served=self.lookup, admits=admits,
        )  # fmt: skip
        for topic in subscribe_topics(self.peer_id, self.reader.topic_level(), self.config):
            net.pubsub.subscribe(topic, self.served.host, self.reader.take_announcement)
        topics = lambda: publish_topics(self.peer_id, self.reader.topic_level(), self.config)  # noqa: E731
        self.publisher = SwarmPublisher(
            self.config, self.public_key, self.counters, TimingLog(net.clock), net.clock,
            write_levels=self.reader.write_levels, served=self.served,
            announce=net.pubsub.announcer(self.served.host, topics), signing_key=self.key,
            may_write_index=lambda: self.reader.index.reads > 0,
        )  # fmt: skip

    def publish(self, *group_ids: str) -> None:
        self.publisher.queue([make_group(g, created_at=self.net.clock.time()) for g in group_ids])
        asyncio.run(self.publisher.flush(self.net.dht))

    def poll(self) -> None:
        asyncio.run(self.reader.poll(self.net.dht))

    def taken_ids(self, count: int) -> list[str]:
        return [item.group.group_id for item in self.reader.take(count)]


def _records(net: Net) -> list[str]:
    return [key for keys in net.dht.reads for key in keys]


# ------------------------------------------------------------------------------------------------ the wire


def test_an_announcement_round_trips_and_any_change_breaks_its_signature():
    record = AnnouncedRecord(7, 1.8e9, 4, 48000, record_digest(b"record"), ("basic_arithmetic",))
    data = encode_announcement(KEY, "sapo", "tiny", 1.8e9, "host-1", [record])
    announcement = decode_announcement(data, "sapo")
    assert announcement.sender == fingerprint(KEY.get_public_key().to_bytes())
    assert announcement.records == (record,) and announcement.host == "host-1" and announcement.model == "tiny"
    assert len(data) < 800  # small: it is pushed to every peer of a topic
    with pytest.raises(RecordRejected) as e:
        decode_announcement(data, "another-swarm")  # signed for one swarm only
    assert e.value.reason == "bad_signature"
    tampered = data.replace(b"tiny", b"tinY")
    with pytest.raises(RecordRejected) as e:
        decode_announcement(tampered, "sapo")
    assert e.value.reason == "bad_signature"
    for junk, reason in [(b"\xc1", "not_msgpack"), (b"\x93\x01\x02\x03", "schema"), (b"x" * 4096, "too_large")]:
        with pytest.raises(RecordRejected) as e:
            decode_announcement(junk, "sapo")
        assert e.value.reason == reason
    with pytest.raises(RecordRejected):  # a publisher cannot announce what a receiver would refuse
        encode_announcement(KEY, "sapo", "tiny", 1.8e9, None, [AnnouncedRecord(1, 1.8e9, 0, 10, b"short")])


def signed(payload: dict) -> bytes:
    """An announcement of any payload, signed as encode_announcement signs, so that its schema is what is checked."""
    packed = msgpack.packb(payload, use_bin_type=True)
    key_blob = base64.b64decode(KEY.get_public_key().to_bytes()[len(b"ssh-rsa ") :])
    signature = base64.b64decode(KEY.sign(signed_bytes("sapo", packed)))
    return msgpack.packb([packed, key_blob, signature], use_bin_type=True)


RECORD = [7, 1.8e9, 4, 48000, record_digest(b"record"), ["basic_arithmetic"]]  # seq ... tasks, as on the wire


def payload(record: list = RECORD, **changes: Any) -> dict:
    return {"version": 1, "model": "tiny", "updated_at": 1.8e9, "host": "host-1", "records": [record], **changes}


def record_with(position: int, value: Any) -> list:
    return [value if i == position else field for i, field in enumerate(RECORD)]


@pytest.mark.parametrize(
    ("sent", "reason", "named"),
    [
        (payload(version=2), "wrong_version", "version"),
        (payload(model="m" * 17), "field_too_long", "model"),
        (payload(host="h" * 129), "field_too_long", "host"),
        (payload(host=7), "schema", "host"),
        (payload(updated_at=-1.0), "schema", "updated_at"),
        (payload(extra=1), "schema", "extra"),
        ({k: v for k, v in payload().items() if k != "host"}, "schema", "host"),
        (payload(records=[RECORD] * 5), "schema", "records"),
        (payload(record_with(0, True)), "schema", "seq"),
        (payload(record_with(0, 2**63)), "schema", "seq"),
        (payload(record_with(1, float("nan"))), "schema", "created_at"),
        (payload(record_with(2, 65)), "too_many_groups", "groups"),
        (payload(record_with(2, 0)), "too_many_groups", "groups"),
        (payload(record_with(3, 3 * 2**20 + 1)), "too_large", "bytes"),
        (payload(record_with(4, b"d" * 31)), "schema", "digest"),
        (payload(record_with(5, ["t"] * 9)), "field_too_long", "tasks"),
        (payload(record_with(5, ["t" * 17])), "field_too_long", "task"),
        (payload(RECORD[:5]), "schema", "record"),
    ],
)
def test_every_announced_field_is_refused_with_its_reason_and_named(sent, reason, named):
    limits = RecordLimits(max_field_chars=16)
    assert decode_announcement(signed(payload()), "sapo", limits).records[0].tasks == ("basic_arithmetic",)
    with pytest.raises(RecordRejected) as e:
        decode_announcement(signed(sent), "sapo", limits)
    assert e.value.reason == reason and named in e.value.detail


# ------------------------------------------------------------------------------------------------ intake


def test_an_announced_record_is_fetched_from_its_publisher_without_reading_the_index():
    net = Net()
    a, b = Peer(net), Peer(net)
    b.poll()  # b's first poll reads the index once (nothing there yet)
    net.dht.reads.clear()
    a.publish("a1", "a2")  # served and announced at once; its index entry waits for a's first index read
    assert not any("/index/" in key for key in net.dht.items)
    assert b.reader.peers()[0].peer == a.peer_id
    b.poll()
    assert sorted(b.taken_ids(10)) == ["a1", "a2"]
    assert not any("/index/" in key for key in _records(net))  # not one index read
    assert a.counters.snapshot()["published_records"] == 1 and b.counters.snapshot()["announcements_received"] >= 1


def test_invalid_announcements_are_refused_and_counted():
    net = Net()
    member, outsider = RSAPrivateKey(), RSAPrivateKey()
    members = {fingerprint(member.get_public_key().to_bytes())}
    b = Peer(net, admits=members.__contains__)
    a = Peer(net, key=member)
    record = AnnouncedRecord(1, net.clock.time(), 1, 100, record_digest(b"x"))
    now = net.clock.time()
    relayed = encode_announcement(member, "sapo", "m", now, a.served.host, [record])
    assert not b.reader.take_announcement(relayed, "someone-else")  # re-published by another libp2p peer
    foreign = encode_announcement(outsider, "sapo", "m", now, "host-x", [record])
    assert not b.reader.take_announcement(foreign, "host-x")  # not a member of this closed swarm
    future = encode_announcement(member, "sapo", "m", now + 60, a.served.host, [record])
    assert not b.reader.take_announcement(future, a.served.host)
    stale = encode_announcement(member, "sapo", "m", now - 3600, a.served.host, [record])
    assert not b.reader.take_announcement(stale, a.served.host)
    counters = b.counters.snapshot()
    assert [counters.get(f"rejected/{r}") for r in ("wrong_host", "not_member", "clock_skew", "expired")] == [1] * 4
    assert b.reader.peers() == []


def test_fresh_identities_heard_from_make_ten_lines_a_minute_each_with_a_short_model_name(caplog):
    """A line for each identity heard from, with its model name of up to 1,024 characters of its choice, let peers
    announcing fresh identities rotate the node's log away in minutes; 25 heard at once make 10 lines, the model name
    cut to 64 characters."""
    from swarm.log_lines import PEER_LINES_BURST

    net = Net()
    b = Peer(net)
    now = net.clock.time()
    record = AnnouncedRecord(1, now, 1, 100, record_digest(b"x"))
    with caplog.at_level("INFO", logger="swarm.reader"):
        for n in range(25):
            announced = encode_announcement(RSAPrivateKey(), "sapo", "\x01" * 1024, now, f"host-{n}", [record])
            assert b.reader.take_announcement(announced, f"host-{n}")
    lines = [r.getMessage() for r in caplog.records if r.name == "swarm.reader" and "heard from" in r.getMessage()]
    assert len(lines) == PEER_LINES_BURST and len(b.reader.peers()) == 25
    assert all(len(line) < 400 for line in lines), lines[0]


def test_a_record_that_is_not_the_one_announced_is_refused():
    from swarm.records import GroupRecord, encode_record
    from swarm.validation import owner_marker

    net = Net()
    a, b = Peer(net), Peer(net)
    a.publish("a1")
    [key] = list(a.served._records)
    # a now serves, under the same key and properly signed, another record than the one it announced
    other = encode_record(GroupRecord([make_group("other", created_at=net.clock.time())], net.clock.time()))
    a.served.serve(key, owner_marker(a.public_key), other, net.clock.time() + 600)
    b.poll()
    assert b.counters.snapshot()["rejected/digest_mismatch"] == 1
    assert b.reader.take(10) == []


def test_a_record_of_another_size_than_announced_is_refused():
    """The announced size schedules the refill (swarm.refill.weight): a sender announcing its large records small
    would have them fetched as small ones."""
    from swarm.records import GroupRecord, encode_record
    from swarm.validation import owner_marker, record_key

    for told in (None, 100):
        net = Net()
        a, b = Peer(net), Peer(net)
        now = net.clock.time()
        data = encode_record(GroupRecord([make_group("big", completion_chars=4096, created_at=now)], now))
        a.served.serve(record_key("sapo", a.peer_id, 1), owner_marker(a.public_key), data, now + 600)
        said = AnnouncedRecord(1, now, 1, told or len(data), record_digest(data))
        assert b.reader.take_announcement(encode_announcement(a.key, "sapo", "m", now, a.served.host, [said]),
                                          a.served.host)  # fmt: skip
        b.poll()
        if told is None:
            assert b.taken_ids(10) == ["big"]
        else:
            assert b.counters.snapshot()["rejected/digest_mismatch"] == 1 and b.taken_ids(10) == []


@pytest.mark.parametrize("honest_records", [10, 1])
def test_refills_between_two_takes_fetch_one_sender_s_large_records_for_its_share_of_bytes_only(honest_records):
    """The caller takes 16 groups every 10 s, the poller refills in between; a sender judged good publishes ten
    records of one 130 KB group a step beside an honest one (ten records a step, or one). Counted in groups, each
    step fetched 8 of its records (its share), and with the honest sender offering one, one more at every poll of the
    step; counted in bytes (16 KiB a group here, to keep the records small), one, and one beyond its share when the
    honest sender leaves some of the take."""
    net = Net()
    large, honest = Peer(net), Peer(net)
    reader = Peer(net, refill_group_bytes=16 * 2**10)
    served = lambda peer: peer.counters.snapshot().get("served_requests", 0)  # noqa: E731
    fetched: list[tuple[int, int]] = []
    for step in range(6):
        now = net.clock.time()
        for n in range(10):
            large.publisher.queue([make_group(f"large-{step}-{n}", completion_chars=16384, completions=8,
                                              created_at=now)])  # fmt: skip
            asyncio.run(large.publisher.flush(net.dht))
            if n < honest_records:
                honest.publish(f"honest-{step}-{n}")
        for sender in (large, honest):  # once their records are heard of (the node trained on their groups)
            reader.reader.judge(sender.peer_id, True)
        before = served(large), served(honest)
        for _ in range(9):  # the poller between two takes
            net.clock.advance(1)
            reader.poll()
        fetched.append((served(large) - before[0], served(honest) - before[1]))
        taken = reader.taken_ids(16)
        net.clock.advance(1)
        if step >= 3:  # the caller's pace is known: each take has the honest sender's share, or all it offered
            assert sum(group.startswith("honest") for group in taken) >= min(8, honest_records), taken
    assert reader.reader.pace() == (10.0, 16)
    expected = (1, 8) if honest_records == 10 else (2, 1)
    assert fetched[3:] == [expected] * 3, fetched  # (large records, honest records) a step


def test_a_stranger_s_large_records_spend_only_the_pool_and_leave_the_refills_to_a_sender_judged_good():
    """Two identities not judged good each send a record of one 130 KB group (8 groups' worth at 16 KiB a group);
    counted at a sender's share of the need (8) in what the refills still want, the two covered the take and the
    honest sender's records published later in the step waited for the next take. Counted at their share of the pool
    (2 each of 4), the honest records are fetched before the take."""
    net = Net()
    strangers, honest = [Peer(net), Peer(net)], Peer(net)
    reader = Peer(net, refill_group_bytes=16 * 2**10, prefetch_groups=16)
    honest.publish("honest-early")
    reader.reader.judge(honest.peer_id, True)
    for stranger in strangers:
        stranger.publisher.queue([make_group(f"large-{stranger.peer_id}", completion_chars=16384, completions=8,
                                             created_at=net.clock.time())])  # fmt: skip
        asyncio.run(stranger.publisher.flush(net.dht))
    reader.poll()
    # the pool (4 groups) and the good sender's early record covered; its share and the rest still wanted
    assert reader.reader.wanted() == 16 - 4 - 1
    net.clock.advance(1)
    honest.publish("honest-late")
    net.clock.advance(1)
    reader.poll()
    assert "honest-late" in reader.taken_ids(16)


def test_take_hands_out_the_newest_groups_first_across_publishers():
    net = Net()
    publishers = [Peer(net) for _ in range(3)]
    reader = Peer(net)
    for round_ in range(2):
        for n, publisher in enumerate(publishers):
            publisher.publish(f"p{n}-r{round_}")
            net.clock.advance(1)
    chosen = reader.reader.choose_refs(2)  # one record of each of the two freshest publishers, not two of one
    assert [sender for sender, _ in chosen] == [publishers[2].peer_id, publishers[1].peer_id]
    reader.poll()
    assert reader.taken_ids(3) == ["p2-r1", "p1-r1", "p0-r1"]  # newest first
    assert reader.taken_ids(10) == ["p2-r0", "p1-r0", "p0-r0"]


def test_the_cache_is_refilled_just_before_the_callers_next_step_with_the_freshest_record():
    net = Net()
    a, b, reader = Peer(net), Peer(net), Peer(net, refill_lead=1.0)
    for step in range(3):  # the caller takes 4 groups every 10 s
        a.publish(f"warm-{step}")
        reader.poll()
        reader.reader.take(4)
        net.clock.advance(10)
    assert reader.reader.pace() == (10.0, 4)
    reader.reader.take(4)
    net.dht.reads.clear()
    net.clock.advance(2)
    a.publish("early-1", "early-2", "early-3", "early-4")
    net.clock.advance(1)
    reader.poll()  # 7 s before the next step: nothing fetched yet
    assert reader.reader.cached_groups() == 0 and not net.dht.reads
    net.clock.advance(5)
    b.publish("late-1", "late-2", "late-3", "late-4")
    net.clock.advance(1.5)
    reader.poll()  # 0.5 s before the step: the refill (due 1 s before it) fetches the freshest record known
    taken = reader.taken_ids(4)
    # the freshest record's groups first, not the first announced; one sender's groups make at most half a take
    # (refill_sender_share), so the early record, fetched for the refill's other half, gives the rest
    assert [group[:4] for group in taken] == ["late"] * 2 + ["earl"] * 2
    # 3 warm-up records, then the late one and, since one sender's record covers at most half a refill, the early
    # one too: not every record announced
    assert reader.counters.snapshot()["fetched_records"] == 5


def test_a_publisher_that_missed_two_announcements_is_dropped_and_back_when_heard_again():
    net = Net()
    a, b = Peer(net), Peer(net)
    for step in range(4):  # a announces every 10 s
        a.publish(f"a{step}")
        net.clock.advance(10)
    b.reader.book.mark_departures()
    assert [p.peer for p in b.reader.peers()] == [a.peer_id]
    net.clock.advance(5)  # 15 s silent: one announcement missed, within tolerance
    b.reader.book.mark_departures()
    assert b.reader.peers()
    net.clock.advance(10)  # 25 s silent: two missed (2 x 10 s + 3 s)
    b.reader.book.mark_departures()
    assert b.reader.peers() == [] and b.reader.choose_refs(10) == []  # its unread records are not asked for
    assert b.counters.snapshot()["departed_senders"] == 1
    a.publish("back")
    assert [p.peer for p in b.reader.peers()] == [a.peer_id] and b.counters.snapshot()["returned_senders"] == 1


def test_a_slow_publisher_is_hedged_with_a_record_of_another_after_a_round_trip_margin():
    net = Net()
    slow, fast, reader = Peer(net), Peer(net), Peer(net, wait_timeout=5.0)
    fast.publish("fast-1")
    net.clock.advance(1)
    slow.publish("slow-1")  # the fresher one: chosen first
    handle = slow.served.handle

    async def answer_late(request: Any, context: Any = None) -> Any:
        await asyncio.sleep(1.5)
        return await handle(request, context)

    slow.served.handle = answer_late
    reader.reader.fetcher.round_trip.add(0.01)  # round trips so far: ~10 ms

    async def fetch_and_run_on() -> None:
        await reader.reader.fetch_records(net.dht, 1)  # ends after two hedge times, the slow request still running
        assert reader.counters.snapshot()["fetches_left_running"] == 1
        await asyncio.sleep(2.0)  # the transport's loop runs on: the request left running ends in the background

    asyncio.run(fetch_and_run_on())
    assert reader.counters.snapshot()["hedged_fetches"] == 1
    assert sorted(reader.taken_ids(10)) == ["fast-1", "slow-1"]  # the slow one arrived too, and is kept


def test_only_peers_of_the_topics_listened_to_since_long_enough_can_miss_announcements():
    net = Net()
    a, b = Peer(net), Peer(net)
    for step in range(3):
        a.publish(f"a{step}")
        net.clock.advance(10)
    net.clock.advance(30)  # a silent for 40 s: two missed announcements
    book = b.reader.book
    assert book.mark_departures(audible=lambda sender: False) == []  # a's topic is no longer listened to
    assert book.mark_departures(since=net.clock.time() - 5) == []  # listened to for 5 s only
    assert book.mark_departures() == [a.peer_id]


def test_an_index_entry_older_than_the_last_announcement_still_offers_the_records_no_announcement_listed():
    # A publisher that put out eight records at once announces the newest two; its index entry, written a moment
    # before that announcement, lists all eight. The reader must be able to fetch all eight, not only two.
    clock = ManualClock()
    book = SenderBook(DHTTransportConfig(), SwarmCounters(), clock)
    now = clock.time()
    refs = [RecordRef(seq, now, 1) for seq in range(1, 9)]
    announced = tuple(AnnouncedRecord(ref.seq, now, 1, 10, b"d" * 32) for ref in refs[-2:])
    book.take_announcement(Announcement("liar", b"key", "m", now, None, announced))
    book.take_index_entry("liar", b"key", IndexEntry(model="m", records=refs, updated_at=now - 1))  # read after it
    chosen, _ = book.choose(16)
    assert sorted(choice.ref.seq for choice in chosen) == list(range(1, 9))


def test_an_index_entry_dated_ahead_is_heard_at_this_peers_now_and_buys_no_place_in_the_book():
    # The book forgets the unjudged sender heard from longest ago first: an entry's date is its sender's word, so one
    # dated ahead of this peer's clock (within the tolerance) counts as heard now, as an entry read now dated now.
    clock = ManualClock()
    book = SenderBook(DHTTransportConfig(max_unknown_senders=2), SwarmCounters(), clock)
    now = clock.time()
    book.take_index_entry("honest", b"k1", IndexEntry(model="m", records=[], updated_at=now))
    clock.advance(1.0)
    book.take_index_entry("ahead", b"k2", IndexEntry(model="m", records=[], updated_at=clock.time() + 2.9))
    assert book._senders["ahead"].heard_at == clock.time()
    clock.advance(1.0)
    book.take_index_entry("ahead", b"k2", IndexEntry(model="m", records=[], updated_at=clock.time() + 2.9))
    book.take_index_entry("newcomer", b"k3", IndexEntry(model="m", records=[], updated_at=clock.time()))
    # heard 2 s ago, honest is forgotten first (as it was); with the date believed, "ahead" stayed the newest
    assert book.standing("honest") == "unknown" and book.standing("ahead") == "unjudged"
    clock.advance(1.0)
    book.take_index_entry("newcomer2", b"k4", IndexEntry(model="m", records=[], updated_at=clock.time()))
    assert book.standing("ahead") == "unknown"  # heard 1 s before newcomer: forgotten before it


def _hanging(peer: Peer) -> None:
    """``peer``'s publisher takes requests for its records and never answers them (a slowloris)."""

    async def never(request: Any, context: Any = None) -> Any:
        await asyncio.sleep(3600)

    peer.served.handle = never


def test_a_publisher_that_never_answers_does_not_hold_up_the_refills_of_honest_records():
    # One hostile identity announces a fresh record before every refill and never answers its requests: each refill
    # used to wait for it until wait_timeout (3 s), so a reader refilled at most once per 3 s whatever its pace.
    net = Net()
    honest, hostile, reader = Peer(net), Peer(net), Peer(net)
    _hanging(hostile)
    reader.reader.fetcher.round_trip.add(0.01)  # honest round trips so far: ~10 ms
    rounds: list[float] = []

    async def refills(seconds: float) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        step = 0
        while loop.time() - began < seconds:
            step += 1
            net.clock.advance(1)  # a fresh announcement ends the rest a failed request gave the hostile host
            for peer in (honest, hostile):
                peer.publisher.queue([make_group(f"{peer.peer_id}-{step}", created_at=net.clock.time())])
                await peer.publisher.flush(net.dht)
            started = loop.time()
            await reader.reader.fetch_records(net.dht, 2)
            rounds.append(loop.time() - started)
        await asyncio.sleep(0.01)

    asyncio.run(refills(4.0))
    honest_taken = [g for g in reader.taken_ids(100) if g.startswith(honest.peer_id)]
    assert max(rounds) < 1.0, rounds  # a round waits two hedge times at most, not wait_timeout
    assert len(honest_taken) >= 5 and len(honest_taken) == len(rounds)


def test_slow_answers_of_senders_not_judged_good_do_not_lengthen_the_hedge_time_of_every_round():
    net = Net()
    good, stranger, reader = Peer(net), Peer(net), Peer(net)
    fetcher = reader.reader.fetcher
    good.publish("good-1")
    reader.reader.judge(good.peer_id, True)
    asyncio.run(reader.reader.fetch_records(net.dht, 1))
    fast = fetcher.hedge_after()
    handle = stranger.served.handle

    async def answer_late(request: Any, context: Any = None) -> Any:
        net.clock.advance(2.5)  # the fetcher times a request on the reader's clock: 2.5 s pass before the answer
        return await handle(request, context)

    stranger.served.handle = answer_late
    for step in range(4):
        stranger.publish(f"slow-{step}")
        asyncio.run(reader.reader.fetch_records(net.dht, 1))
    assert fetcher.hedge_after() == fast  # the stranger's valid but slow answers moved nothing


def test_an_announcement_published_again_byte_for_byte_is_dropped_before_its_signature_is_checked():
    # One signed announcement published over and over cost its signature check each time (23,088 in 10 s from one
    # libp2p peer on loopback: 1.77 s of the reader's CPU); a copy says nothing new. Another peer's copy of it does not
    # shadow the original, and the publisher's next announcement (dated afresh) is taken.
    net = Net()
    a, b = Peer(net), Peer(net)
    key = RSAPrivateKey()
    record = AnnouncedRecord(1, net.clock.time(), 1, 100, record_digest(b"x"))
    data = encode_announcement(key, "sapo", "m", net.clock.time(), "host-x", [record])
    assert not b.reader.take_announcement(data, "someone-else")  # a copy re-published by another peer: refused
    assert b.reader.take_announcement(data, "host-x")
    for _ in range(100):
        assert not b.reader.take_announcement(data, "host-x")
    counters = b.counters.snapshot()
    assert counters["announcements_received"] == 1 and counters["announcements_repeated"] == 100
    assert counters["rejected/wrong_host"] == 1
    net.clock.advance(1)
    fresh = encode_announcement(key, "sapo", "m", net.clock.time(), "host-x", [record])
    assert b.reader.take_announcement(fresh, "host-x")
    assert a.counters.snapshot().get("announcements_repeated", 0) == 0


def test_recent_messages_remember_a_bounded_number_of_digests():
    from swarm.repeats import RecentMessages

    seen = RecentMessages(capacity=3)
    assert [seen.repeated(m) for m in (b"a", b"b", b"a", b"c", b"d")] == [False, False, True, False, False]
    assert seen.repeated(b"a") and not seen.repeated(b"b")  # "a" was used lately and kept; "b" the oldest, forgotten
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        RecentMessages(capacity=0)
