"""Tests of the in-memory transport's contract and of waiting for peers (shared by every transport)."""

from __future__ import annotations

import time

from swarm.memory import MemorySwarm
from swarm.transport import wait_for_peers
from tests.swarm_fixtures import make_group


def test_a_peer_is_listed_from_joining_not_only_after_publishing():
    swarm = MemorySwarm()
    alice = swarm.join("alice", model="A")
    assert alice.peers() == []
    swarm.join("bob", model="B")
    assert [(p.peer, p.model) for p in alice.peers()] == [("bob", "B")]


def test_fetch_returns_other_peers_groups_once_and_never_ones_own():
    swarm = MemorySwarm()
    alice, bob = swarm.join("alice"), swarm.join("bob")
    alice.publish([make_group("a1"), make_group("a2")])
    bob.publish([make_group("b1")])
    first = bob.fetch(1)
    rest = bob.fetch(10)
    assert sorted(item.group.group_id for item in first + rest) == ["a1", "a2"]
    assert bob.fetch(10) == []
    assert [item.group.group_id for item in alice.fetch(10)] == ["b1"]


def test_wait_for_peers_returns_once_enough_are_listed():
    swarm = MemorySwarm()
    alice = swarm.join("alice")
    polls = []

    def join_bob_on_second_poll(seen: int, waited: float) -> None:
        polls.append(seen)
        if len(polls) == 2:
            swarm.join("bob")

    peers = wait_for_peers(alice, 1, timeout=30, poll_interval=0.01, on_wait=join_bob_on_second_poll)
    assert [p.peer for p in peers] == ["bob"] and polls == [0, 0]


def test_wait_for_peers_gives_up_after_the_timeout_with_what_it_has():
    swarm = MemorySwarm()
    alice = swarm.join("alice")
    swarm.join("bob")
    started = time.monotonic()
    peers = wait_for_peers(alice, 3, timeout=0.3, poll_interval=0.05)
    assert [p.peer for p in peers] == ["bob"]
    assert time.monotonic() - started >= 0.3  # it waited out its timeout before giving up
