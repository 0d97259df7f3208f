"""A peer whose initial peers are down starts alone and joins them once one comes up; a peer whose every neighbour
left rejoins when one comes back. Real hivemind peers (p2pd daemons) on 127.0.0.1, always closed."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import socket

import pytest

from tests.swarm_fixtures import dht_peers, make_group, no_p2pd_left_behind, wait_until  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")

# A peer alone tries every 0.5 s at first and backs off to every 2 s.
REJOIN = dict(rejoin_interval=0.5, rejoin_max_interval=2.0)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def taken_ids(peer, into: list) -> set[str]:
    into.extend(peer.fetch(100))
    return {item.group.group_id for item in into}


def test_a_peer_started_alone_joins_its_initial_peer_when_it_comes_up_and_again_after_it_left(dht_peers, tmp_path):
    # The bootstrap peer's address (identity and port) is known before it runs: it ran once and stopped.
    port = free_port()
    bootstrap = dict(identity_path=str(tmp_path / "bootstrap.key"), host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"])
    first = dht_peers(model_name="bootstrap", **bootstrap)
    address = first.visible_addresses()
    first.close()

    alone = dht_peers(model_name="alone", rejoin_peers=address, **REJOIN)
    assert alone.neighbours() == 0 and alone.peers() == []
    alone.publish([make_group("while-alone")])  # publishing alone works: it stores on itself
    wait_until(lambda: alone.readout().counters.get("rejoin_attempts", 0) >= 2, 20, message="(no rejoin attempts)")
    assert alone.readout().gauges["dht_neighbours"] == 0

    up = dht_peers(model_name="bootstrap", **bootstrap)
    assert up.visible_addresses() == address
    joined = lambda: alone.readout().counters.get("rejoins", 0) >= 1  # noqa: E731
    wait_until(joined, 30, message="(the peer alone never joined the bootstrap peer)")
    assert alone.neighbours() >= 1
    up.publish([make_group("b1")])
    got: list = []
    wait_until(lambda: "b1" in taken_ids(alone, got), 30, message="(no group of the bootstrap peer arrived)")
    wait_until(lambda: {p.peer for p in up.peers()} == {alone.peer_id}, 30, message="(the bootstrap never saw it)")

    # every neighbour leaves: alone again; the bootstrap comes back: joined again, exchange resumes
    up.close()
    wait_until(lambda: alone.neighbours() == 0, 60, message="(the peer never noticed its neighbour left)")
    back = dht_peers(model_name="bootstrap", **bootstrap)
    wait_until(lambda: alone.readout().counters.get("rejoins", 0) >= 2, 30, message="(no second rejoin)")
    back.publish([make_group("b2")])
    wait_until(lambda: "b2" in taken_ids(alone, got), 30, message="(no group after the second rejoin)")
    assert alone.healthy()


def test_a_peer_notices_its_last_neighbour_left_by_its_own_check_not_at_its_next_store(dht_peers):
    """hivemind drops a neighbour from its routing table only when a request to it fails; a peer that stores its index
    entry once an hour would count a neighbour that left as present until then (and so not know it is alone). Its
    neighbour check (every `rejoin_interval`) pings the neighbours it lists when none of them is connected, so the one
    that left is dropped within a check or two."""
    quiet = dict(announce_interval=3600.0, index_refresh_interval=3600.0, **REJOIN)
    a = dht_peers(model_name="A", **quiet)
    b = dht_peers(model_name="B", initial_peers=a.visible_addresses(), **quiet)
    wait_until(lambda: a.neighbours() == 1 and b.neighbours() == 1, 20, message="(the two never met)")
    b.close()
    wait_until(lambda: a.neighbours() == 0, 20, message="(a still lists the neighbour that left)")
