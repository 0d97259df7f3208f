"""Pushed announcements on real DHT peers (p2pd with GossipSub) on loopback: records reach readers without index
reads, newest first, and a peer that left is dropped after two missed announcements."""

# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import time

import pytest

from tests.swarm_fixtures import dht_peers, make_group, no_p2pd_left_behind, wait_until  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")

QUIET_INDEX = dict(index_refresh_interval=600.0)  # after its first read, a peer reads the index only if starving
# A departure is taken after two missed announcements plus the clock tolerance: 3 s with these, not 2 x 2 s + 3 s
QUICK_DEPARTURE = dict(announce_interval=1.0, clock_skew_tolerance=1.0)


def _hear_each_other(peers: list) -> None:
    for peer in peers:
        others = {p.peer_id for p in peers if p is not peer}
        wait_until(lambda peer=peer, others=others: others <= {p.peer for p in peer.peers()}, 30)


def test_a_record_reaches_every_peer_by_announcement_without_index_reads(dht_peers):
    # A reader whose topic is silent for a few announcement intervals reads the index again (as it should: a publisher
    # may have left); on a loaded machine late announcements did that here. These readers wait 30 missed ones.
    patient = dict(QUIET_INDEX, departed_after_missed=30)
    a = dht_peers(model_name="A", **QUIET_INDEX)
    b = dht_peers(initial_peers=a.visible_addresses(), **patient)
    c = dht_peers(initial_peers=b.visible_addresses(), **patient)
    _hear_each_other([a, b, c])
    # Peers may have met through the index: until announcements arrive, a silent reader keeps reading it, so the
    # count of reads is taken once both readers hear announcements (their topic's mesh has formed).
    wait_until(lambda: all(p.readout().counters.get("announcements_received", 0) >= 2 for p in (b, c)), 30)
    reads_before = {p.peer_id: p.readout().counters.get("index_reads", 0) for p in (b, c)}
    a.publish([make_group("fresh-1"), make_group("fresh-2")])
    for reader in (b, c):
        got: list = []
        wait_until(lambda reader=reader, got=got: got.extend(reader.fetch(10)) or len(got) >= 2, 20)
        assert sorted(item.group.group_id for item in got) == ["fresh-1", "fresh-2"]
        counters = reader.readout().counters
        assert counters["index_reads"] == reads_before[reader.peer_id]  # the announcement was enough
        assert counters["announcements_received"] >= 1
        assert len(reader.readout().timings["delivery"]) >= 1  # its delivery time is measured (metrics, not asserted)
    assert a.readout().counters["announcements_sent"] >= 1


def test_fetch_hands_out_the_newest_groups_first(dht_peers):
    a = dht_peers(**QUIET_INDEX)
    b = dht_peers(initial_peers=a.visible_addresses(), prefetch_groups=8, **QUIET_INDEX)
    _hear_each_other([a, b])
    for n in range(3):
        a.publish([make_group(f"g{n}", created_at=time.time())])
        time.sleep(0.3)
    wait_until(lambda: b.ready_groups() >= 3, 20)
    assert [item.group.group_id for item in b.fetch(3)] == ["g2", "g1", "g0"]


def test_a_peer_that_left_is_dropped_after_two_missed_announcements_not_at_its_entrys_expiry(dht_peers):
    a = dht_peers(model_name="A", **QUIET_INDEX, **QUICK_DEPARTURE)
    b = dht_peers(initial_peers=a.visible_addresses(), **QUIET_INDEX, **QUICK_DEPARTURE)
    # b has heard a's announcements (every 1 s when idle), not only read its index entry
    wait_until(lambda: b.readout().counters.get("announcements_received", 0) >= 3, 30)
    a.publish([make_group("last")])
    a.close()  # its index entry lives for the record ttl (600 s), well beyond this wait
    wait_until(lambda: a.peer_id not in {p.peer for p in b.peers()}, 30)  # two missed announcements (2 x 1 s)
    # dropped as departed (an expiry is no departure); under load a late announcement may already have marked it
    # departed once before it left (heard again, it was back), so the count is at least one
    assert b.readout().counters["departed_senders"] >= 1


def test_records_of_a_publisher_that_left_before_the_readers_refill_are_still_fetched(dht_peers):
    """A publisher announces two records (stored in the DHT) and leaves 3 s later; the readers, whose callers take
    groups every 18 s, refill only once it has been taken as departed (two missed announcements). Its records outlive
    it in the DHT until their ttl, so every reader still fetches both."""
    # The publisher lives a few announcements (every 1 s) after publishing; the pace leaves about 10 s between its
    # departure (about 4 s after it leaves) and the refill (1 s before the next take), as 26 s did with 2 s ones.
    lifetime = 3.0
    pace = lifetime + 15.0
    # fetch_heard_within beyond the pace: the refill, not an early fetch of records heard a while ago, reads them
    late = dict(fetch_heard_within=600.0, **QUIET_INDEX, **QUICK_DEPARTURE)
    readers = [dht_peers(**late)]
    readers.append(dht_peers(initial_peers=readers[0].visible_addresses(), **late))
    publisher = dht_peers(
        initial_peers=readers[0].visible_addresses(), serve_records=False, **QUIET_INDEX, **QUICK_DEPARTURE
    )
    _hear_each_other([*readers, publisher])
    for reader in readers:  # the callers' pace: 2 groups every `pace` seconds
        assert reader.fetch(2) == []
    time.sleep(pace)
    for reader in readers:
        assert reader.fetch(2) == []
    publisher.publish([make_group("first")])
    publisher.publish([make_group("second")])
    wait_until(lambda: all(publisher.peer_id in {p.peer for p in r.peers()} for r in readers), 10)
    time.sleep(lifetime)
    publisher.close()
    # Taken as departed about 3 s later (2 missed announcements of 1 s, plus the clock tolerance), before the refill
    # due a pace after the last take.
    wait_until(lambda: all(publisher.peer_id not in {p.peer for p in r.peers()} for r in readers), 30)
    for reader in readers:
        assert reader.readout().counters.get("fetched_records", 0) == 0  # nothing read before the refill
    wait_until(lambda: all(r.ready_groups() >= 2 for r in readers), pace)
    for reader in readers:
        assert sorted(item.group.group_id for item in reader.fetch(2)) == ["first", "second"]
