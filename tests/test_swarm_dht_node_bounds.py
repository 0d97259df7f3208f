"""What hivemind's DHT node remembers of the keys a peer looks up and of the peers its lookups tried stays bounded,
whatever keys and peer ids other peers name, on a real DHT peer (p2pd on loopback)."""

# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import os
import types

import pytest
from hivemind.dht.node import Blacklist
from hivemind.p2p import PeerID

from swarm.hivemind_bridge import trim_ban_counts
from swarm.peer import BAN_COUNTS_KEPT
from tests.swarm_fixtures import dht_peers, no_p2pd_left_behind, wait_until  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")


def test_a_peer_looking_up_many_distinct_keys_keeps_nothing_per_key_in_its_dht_node(dht_peers):
    # A record is looked up under records/<sender>/<seq>, named by its sender: hivemind's reuse of concurrent lookups
    # kept an empty entry (about 1.8 KB) for every key ever looked up.
    peer = dht_peers()
    node = peer.peer.node

    async def look_up() -> None:
        for n in range(50):
            await node.get_many([f"records/made-up-{n}/{n}"])

    asyncio.run_coroutine_threadsafe(look_up(), peer.peer.loop).result(60)
    assert len(node.pending_get_requests) == 0


def _made_up_peer() -> PeerID:
    return PeerID(b"\x12\x20" + os.urandom(32))  # a sha256 multihash, as libp2p ids are


def test_failure_counts_of_peers_that_never_answered_are_kept_within_a_bound_those_banned_now_last():
    blacklist = Blacklist(base_time=5.0, backoff_rate=2.0)
    node = types.SimpleNamespace(blacklist=blacklist)
    banned = [_made_up_peer() for _ in range(3)]
    for peer in banned:
        blacklist.register_failure(peer)  # a ban of 5 s, running now
    over = [_made_up_peer() for _ in range(300)]
    for peer in over:
        blacklist.ban_counter[peer] += 1  # failed once, its ban over
    assert trim_ban_counts(node, 100) == 203
    assert set(blacklist.ban_counter) == set(banned) | set(over[-97:])  # the oldest whose ban is over went first
    assert all(peer in blacklist for peer in banned)  # the bans running now run on
    assert trim_ban_counts(node, 100) == 0


def test_a_peer_forgets_the_peers_its_lookups_tried_in_vain_beyond_a_bound(dht_peers):
    # Made-up libp2p ids named in answers to this peer's lookups each failed a dial and left hivemind a failure count
    # that it drops only when that peer answers: about 7 a lookup, 28 a second on an idle node, for good.
    peer = dht_peers()
    blacklist = peer.peer.node.blacklist

    async def fail_dials() -> int:  # on the node's loop, as its lookups do
        for _ in range(3 * BAN_COUNTS_KEPT):
            blacklist.register_failure(_made_up_peer())
        return len(blacklist.ban_counter)

    assert asyncio.run_coroutine_threadsafe(fail_dials(), peer.peer.loop).result(30) >= 3 * BAN_COUNTS_KEPT
    peer.peer.wake("neighbours")
    wait_until(lambda: len(blacklist.ban_counter) <= BAN_COUNTS_KEPT, 30, message=f"{len(blacklist.ban_counter)}")
