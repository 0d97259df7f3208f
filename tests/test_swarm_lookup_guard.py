"""The lookup guard: the neighbours a find answer names hold one node id per libp2p peer (the answerer naming itself
dropped, a known peer under the id it is known by), so a hostile node answering with made-up nearer ids of itself is
asked about once per lookup, not again and again until the lookup's timeout. The rule alone, then a real reader on
127.0.0.1 and a hostile node (testbed.lookup_attack)."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import time

import pytest
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils import get_dht_time

from swarm.hivemind_bridge import gate_find_handler
from swarm.lookup_guard import one_id_per_peer
from testbed.hostile_peer import HostileNode
from testbed.lookup_attack import attack
from tests.swarm_fixtures import dht_peers, no_p2pd_left_behind, record_p2pd, wait_until  # noqa: F401

NEVER_RAN = "12D3KooWRmFgS59qzkgTAuMp6kSdLrVCJyJy3APh8FHmvP1fFUqB"  # a well-formed libp2p peer id no test runs


def test_an_answer_names_each_peer_once_under_the_id_it_is_known_by():
    known = {"honest": 7}.get
    neighbours = [(101, "hostile"), (102, "honest"), (103, "hostile"), (104, "honest"), (105, "me"), (106, "new")]
    kept, ignored = one_id_per_peer(neighbours, known, ("hostile", "me"))
    # the answerer naming itself, and this node: dropped; a known peer: under its id (which a lookup that asked it
    # visited); an unknown one: under the first id named for it
    assert kept == [(7, "honest"), (106, "new")] and ignored == 5
    assert one_id_per_peer([(2, "b"), (3, "c")], lambda peer: None, ("a",)) == ([(2, "b"), (3, "c")], 0)  # honest
    assert one_id_per_peer([(2, "b")], {"b": 2}.get, ("a",)) == ([(2, "b")], 0)
    # another peer named, or known, under this node's id (hivemind's store asserted that no search finds it): dropped
    assert one_id_per_peer([(1, "b"), (3, "c")], {"c": 1}.get, ("a",), (1,)) == ([], 3)


@pytest.mark.usefixtures("no_p2pd_left_behind")
def test_a_hostile_node_naming_made_up_ids_of_itself_is_asked_about_once_per_lookup(dht_peers):
    readers = []

    def make_reader(**config):
        readers.append(dht_peers(check_reachability=False, **config))
        return readers[-1]

    result = attack(make_reader, entries=16, seconds=8.0, on_p2pd=record_p2pd)
    # hivemind's lookup asked it 3009-4303 times in 20 s (64 entries an answer), the reader's event loop busy 10-15 s
    assert result["asked"] <= 3, result
    assert result["seconds"] < 4.0 and result["loop_cpu_seconds"] < 1.0, result
    assert result["entries_found"] == 16  # what it answered is still read (valid, if older than wanted)
    (reader,) = readers
    assert reader.readout().counters["lookup_ids_ignored"] >= 8
    assert reader.healthy()


@pytest.mark.usefixtures("no_p2pd_left_behind")
def test_a_find_answer_naming_this_nodes_own_id_no_longer_fails_its_stores(dht_peers):
    """hivemind's store asserts that no search finds the storing node itself; a hostile node naming the reader's own
    node id (under any libp2p peer) in its answers made every store of the reader raise."""
    reader = dht_peers()
    hostile = HostileNode(reader.visible_addresses(), on_p2pd=record_p2pd)
    try:
        node = reader.peer.node
        # this node's id under another libp2p peer than the answerer or the reader (a peer that never ran: the rule
        # that drops what the answerer says of itself must not be what saves the store)
        own_id, other_peer = node.node_id.to_bytes(), PeerID.from_base58(NEVER_RAN).to_bytes()

        async def names_the_reader(request, context):
            response = dht_pb2.FindResponse(results=[], peer=hostile.node.protocol.node_info)
            for _ in request.keys:
                result = dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
                result.nearest_node_ids.append(own_id)
                result.nearest_peer_ids.append(other_peer)
                response.results.append(result)
            return response

        hostile.run(gate_find_handler(hostile.node, lambda answer, refuse: names_the_reader))
        # a reader without neighbours stores locally and asks nobody: first the hostile node (joined through it) is one
        wait_until(
            lambda: hostile.node.p2p.peer_id in reader.peer.neighbour_peer_ids(), message="hostile node not a neighbour"
        )

        def ignored() -> int:
            return reader.readout().counters.get("lookup_ids_ignored", 0)

        # hivemind raised its AssertionError at every try. The tests' wait_timeout is 1 s: on a loaded machine a find
        # to the hostile node (its RPCs run in this process, beside the test's others) may time out, the node is then
        # banned for 5 s (doubled at each miss), and a store stores without having read an answer (proving nothing).
        # So tries, for up to 40 s, until one whose lookup read the answer, which must store
        read_and_stored, deadline = False, time.monotonic() + 40
        while not read_and_stored and time.monotonic() < deadline:
            before = ignored()
            store = node.store("some key", b"a value", get_dht_time() + 60)
            stored = asyncio.run_coroutine_threadsafe(store, reader.peer.loop).result(30)
            read_and_stored = stored and ignored() > before
            if not read_and_stored:
                time.sleep(1.0)
        assert read_and_stored, reader.readout().counters
    finally:
        hostile.close()
