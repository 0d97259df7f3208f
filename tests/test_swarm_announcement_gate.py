"""The announcement gate: a publisher over its budget, or mostly refused, rests; strangers share one budget; copies and
this node's own announcements are not held against anyone. Unit tests on an injected clock, then a forger on real
DHT peers (p2pd with GossipSub) on loopback."""

# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import os
import time

import msgpack
import pytest

from swarm.announcement_gate import (
    KNOWN_HOSTS_SECONDS,
    MIN_REFUSED,
    PUBLISHER_BUDGET,
    REST_SECONDS,
    STRANGERS_BUDGET,
    WINDOW_SECONDS,
    AnnouncementGate,
    Taken,
)
from swarm.transport import SwarmCounters
from tests.swarm_fixtures import dht_peers, make_group, no_p2pd_left_behind, wait_until  # noqa: F401


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gate_and_clock() -> tuple[AnnouncementGate, SwarmCounters, Clock]:
    counters, clock = SwarmCounters(), Clock()
    return AnnouncementGate(counters, lambda: "me", clock), counters, clock


def deliver(gate: AnnouncementGate, publisher: str, outcome: Taken, times: int = 1) -> list[Taken]:
    """``times`` announcements of ``publisher`` through the gate, each taken as ``outcome`` if admitted."""
    take = gate.guard(lambda data, sender: outcome)
    return [take(b"x", publisher) for _ in range(times)]


def test_a_publisher_over_its_budget_rests_and_rests_longer_the_next_time():
    gate, counters, clock = gate_and_clock()
    outcomes = deliver(gate, "flooder", Taken.TAKEN, PUBLISHER_BUDGET + 10)
    assert outcomes[:PUBLISHER_BUDGET] == [Taken.TAKEN] * PUBLISHER_BUDGET
    assert outcomes[PUBLISHER_BUDGET:] == [Taken.REFUSED] * 10  # dropped unread
    counts = counters.snapshot()
    assert counts["rejected/announce_budget"] == 1 and counts["rejected/announce_rested"] == 9
    assert counts["announce_publishers_rested"] == 1
    assert deliver(gate, "honest", Taken.TAKEN) == [Taken.TAKEN]  # another publisher is not held back
    clock.now += REST_SECONDS + 1
    assert deliver(gate, "flooder", Taken.TAKEN, PUBLISHER_BUDGET + 1)[-1] is Taken.REFUSED  # over again: rests
    clock.now += REST_SECONDS + 1
    assert gate.resting("flooder")  # its second rest is twice as long
    clock.now += REST_SECONDS
    assert not gate.resting("flooder")


def test_a_publisher_mostly_refused_rests_one_refused_now_and_then_does_not():
    gate, counters, clock = gate_and_clock()
    deliver(gate, "forger", Taken.REFUSED, MIN_REFUSED)
    assert gate.resting("forger")
    assert deliver(gate, "forger", Taken.REFUSED) == [Taken.REFUSED]
    assert counters.snapshot()["rejected/announce_rested"] == 1
    # refusals under half of what a publisher delivered (a skewed clock now and then) rest nobody
    deliver(gate, "careless", Taken.TAKEN, MIN_REFUSED + 1)
    deliver(gate, "careless", Taken.REFUSED, MIN_REFUSED)
    assert not gate.resting("careless")
    # and a window's refusals do not carry into the next
    clock.now += WINDOW_SECONDS + 1
    deliver(gate, "careless", Taken.REFUSED, MIN_REFUSED - 1)
    assert not gate.resting("careless")


def test_copies_and_this_nodes_own_announcements_are_not_held_against_their_publisher():
    gate, _, _ = gate_and_clock()
    # one announcement reaching this node on two topics: every second one a copy
    for _ in range(PUBLISHER_BUDGET // 2):
        deliver(gate, "honest", Taken.TAKEN)
        deliver(gate, "honest", Taken.REPEATED)
    assert not gate.resting("honest")
    assert deliver(gate, "me", Taken.OWN, 10 * PUBLISHER_BUDGET)[-1] is Taken.OWN  # never counted


def test_strangers_share_one_budget_a_window_and_nobody_rests_for_it():
    gate, counters, clock = gate_and_clock()
    deliver(gate, "known", Taken.TAKEN)  # taken once: no stranger any more
    outcomes = [deliver(gate, f"fresh-{i}", Taken.REFUSED)[0] for i in range(STRANGERS_BUDGET + 5)]
    # the known publisher's first announcement, a stranger's then, took one place of the window
    assert counters.snapshot()["rejected/announce_strangers"] == 5 + 1
    assert outcomes.count(Taken.REFUSED) == len(outcomes)
    assert not any(gate.resting(f"fresh-{i}") for i in range(STRANGERS_BUDGET + 5))
    assert deliver(gate, "known", Taken.TAKEN) == [Taken.TAKEN]  # a publisher heard before is no stranger
    clock.now += WINDOW_SECONDS + 1
    assert deliver(gate, "newcomer", Taken.TAKEN) == [Taken.TAKEN]  # the next window admits strangers again


def test_during_a_strangers_flood_a_host_the_index_named_is_still_heard():
    counters, clock, known = SwarmCounters(), Clock(), set()
    gate = AnnouncementGate(counters, lambda: "me", clock, known_hosts=lambda: known)
    for i in range(STRANGERS_BUDGET):
        deliver(gate, f"fresh-{i}", Taken.REFUSED)
    assert deliver(gate, "honest-newcomer", Taken.TAKEN) == [Taken.REFUSED]  # dropped unread: a stranger
    known.add("honest-newcomer")  # an index read names it as the host of a sender
    assert deliver(gate, "honest-newcomer", Taken.TAKEN) == [Taken.REFUSED]  # the hosts known are asked once a second
    clock.now += KNOWN_HOSTS_SECONDS + 0.1
    assert deliver(gate, "honest-newcomer", Taken.TAKEN) == [Taken.TAKEN]
    assert deliver(gate, "fresh-0", Taken.REFUSED) == [Taken.REFUSED]
    assert counters.snapshot()["rejected/announce_strangers"] == 3


@pytest.mark.usefixtures("no_p2pd_left_behind")
def test_a_forger_on_a_real_swarm_is_checked_a_few_times_then_dropped_unread_and_honest_peers_still_heard(dht_peers):
    """A libp2p peer publishing announcements with forged signatures (no cost to it) used to have every one checked;
    now its first few are, then it rests, while an honest publisher's records still reach the node."""
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm.announcements import AnnouncedRecord, encode_announcement
    from swarm.levels import publish_topics
    from swarm.pubsub import publish

    node = dht_peers(index_refresh_interval=600.0, departed_after_missed=30)
    honest = dht_peers(initial_peers=node.visible_addresses(), index_refresh_interval=600.0)
    forger = dht_peers(initial_peers=node.visible_addresses(), index_refresh_interval=600.0)
    wait_until(lambda: node.readout().counters.get("announcements_received", 0) >= 2, 30)  # the topic's mesh formed
    # a valid announcement's payload and key, a signature of random bytes each time
    now = time.time()
    valid = encode_announcement(
        RSAPrivateKey(),
        forger.config.swarm_name,
        "m",
        now,
        None,
        [AnnouncedRecord(0, now, 1, 1000, os.urandom(32), ("t",))],
    )
    payload, key_blob, _ = msgpack.unpackb(valid)
    topic = publish_topics(forger.peer_id, 0, forger.config)[0]

    async def flood(count: int) -> None:
        for _ in range(count):
            await publish(forger.peer.p2p, topic, msgpack.packb([payload, key_blob, os.urandom(256)]))

    asyncio.run_coroutine_threadsafe(flood(200), forger.peer.loop).result(60)
    counts = lambda: node.readout().counters  # noqa: E731
    wait_until(lambda: counts().get("rejected/announce_rested", 0) >= 150, 30)
    assert counts()["rejected/bad_signature"] == MIN_REFUSED  # checked until it rested, not 200 times
    assert counts()["announce_publishers_rested"] == 1
    honest.publish([make_group("after-the-flood")])
    got: list = []
    wait_until(lambda: got.extend(node.fetch(10)) or len(got) >= 1, 30)
    assert [item.group.group_id for item in got] == ["after-the-flood"]
