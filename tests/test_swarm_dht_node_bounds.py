"""What hivemind's DHT node remembers of the keys a peer looks up and of the peers its lookups tried stays bounded,
whatever keys and peer ids other peers name, on a real DHT peer (p2pd on loopback)."""

# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio

import pytest

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
