"""The store gate (issue 61): a libp2p peer whose stored values are mostly refused rests, its stores then refused
without a value decoded or verified, while other peers' stores (and its own, once the rest ends) are validated as
before. The rule on a manual clock, then on real DHT peers on 127.0.0.1."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import base64
import os
import time
from types import SimpleNamespace

import pytest
from hivemind.utils.serializer import MSGPackSerializer

from swarm.records import GroupRecord, encode_record
from swarm.store_gate import MAX_REST_SECONDS, STORE_REQUEST, StoreGate
from swarm.transport import SwarmCounters
from swarm.validation import record_key
from testbed.hostile_peer import HostileNode, store_raw
from tests.swarm_fixtures import dht_peers, make_group, no_p2pd_left_behind, record_p2pd, wait_until  # noqa: F401


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def store(gate: StoreGate, sender: str, values: int, refused: int) -> list[bool] | str:
    """One store request of ``values`` values through ``gate``, its validators refusing the first ``refused``."""

    async def rpc_store(request, context):
        assert STORE_REQUEST.get().sender == sender  # the validators know whom a refusal counts against
        for _ in range(refused):
            gate.refused()
        return [True] * (values - refused)

    handler = gate.wrap(rpc_store, lambda request: "refused unverified")
    request = SimpleNamespace(keys=[b"k"] * values)
    context = SimpleNamespace(remote_id=SimpleNamespace(to_base58=lambda: sender))
    return asyncio.run(handler(request, context))


def test_a_sender_whose_values_are_mostly_refused_rests_and_its_rests_double():
    clock, counters = Clock(), SwarmCounters()
    gate = StoreGate(counters, min_refused=32, window=10.0, rest=30.0, clock=clock)
    assert store(gate, "forger", 20, 20) == [] and not gate.resting("forger")  # 20 refusals: not yet
    assert store(gate, "forger", 20, 20) == [] and gate.resting("forger")  # 40 in the window: rests
    assert store(gate, "forger", 50, 0) == "refused unverified"
    assert counters.snapshot()["rejected/sender_rested"] == 50 and counters.snapshot()["store_senders_rested"] == 1
    assert not gate.resting("honest") and store(gate, "honest", 3, 0) == [True] * 3  # others are not touched
    clock.now += 30.5  # the rest is over: validated again, and a second rest lasts twice as long
    assert not gate.resting("forger") and store(gate, "forger", 40, 40) == []
    assert gate.resting("forger")
    clock.now += 59
    assert gate.resting("forger")
    clock.now += 2
    assert not gate.resting("forger")
    for _ in range(6):  # rests double up to the ceiling, then stay there
        store(gate, "forger", 40, 40)
        clock.now += MAX_REST_SECONDS + 1
    store(gate, "forger", 40, 40)
    clock.now += MAX_REST_SECONDS - 1
    assert gate.resting("forger")
    clock.now += 2
    assert not gate.resting("forger")


def test_a_requests_refusals_count_in_one_window_even_when_the_window_ends_while_it_is_validated():
    clock = Clock()
    gate = StoreGate(SwarmCounters(), min_refused=32, window=10.0, clock=clock)
    store(gate, "forger", 1, 1)  # its window opens at 100

    async def slow_rpc_store(request, context):  # 40 values refused, the window ending halfway through
        for i in range(40):
            if i == 20:
                clock.now += 10.5
            gate.refused()
        return []

    handler = gate.wrap(slow_rpc_store, lambda request: "refused unverified")
    request = SimpleNamespace(keys=[b"k"] * 40)
    context = SimpleNamespace(remote_id=SimpleNamespace(to_base58=lambda: "forger"))
    assert asyncio.run(handler(request, context)) == [] and gate.resting("forger")  # 40 of 40 in the new window


def test_an_honest_sender_with_some_refused_values_or_slow_refusals_does_not_rest():
    clock = Clock()
    gate = StoreGate(SwarmCounters(), min_refused=32, window=10.0, clock=clock)
    for _ in range(5):  # many refusals, but fewer than half of its values (stale copies, another peer's limits)
        store(gate, "busy", 100, 40)
    assert not gate.resting("busy")
    for _ in range(10):  # every value refused, but 10 a window: the window's count starts again
        store(gate, "slow", 10, 10)
        clock.now += 10.5
    assert not gate.resting("slow")


def test_the_book_of_senders_is_bounded_and_keeps_the_resting():
    clock = Clock()
    gate = StoreGate(SwarmCounters(), min_refused=2, max_senders=8, clock=clock)
    store(gate, "forger", 2, 2)
    assert gate.resting("forger")
    for n in range(100):  # fresh libp2p identities, each storing once
        store(gate, f"fresh-{n}", 1, 0)
    assert len(gate) == 8 and gate.resting("forger")


def forged(value: bytes) -> bytes:
    return value + b"[signature:" + base64.b64encode(os.urandom(256)) + b"]"


@pytest.mark.usefixtures("no_p2pd_left_behind")
def test_a_real_peer_rests_a_forger_and_still_stores_an_honest_peers_records(dht_peers):
    victim = dht_peers()
    victim.store_gate.rest = 2.0  # short, so that the end of the rest is seen here
    forger = HostileNode(victim.visible_addresses(), on_p2pd=record_p2pd)
    honest = HostileNode(victim.visible_addresses(), on_p2pd=record_p2pd)
    try:
        peer_id, dumps = victim.peer.libp2p_peer_id, MSGPackSerializer.dumps
        good = dumps(encode_record(GroupRecord([make_group("g")], created_at=time.time())))

        def counts() -> dict[str, int]:
            return victim.readout().counters

        def signed_store(node: HostileNode, name: str) -> list[bool]:
            key, expiration = record_key("sapo", name, 1), time.time() + 60
            value = node.signed(key, node.marker, good, expiration)
            return store_raw(node, peer_id, key, dumps(node.marker), value, expiration)

        key, expiration, tag = record_key("sapo", "forger", 1), time.time() + 60, dumps(forger.marker)
        for _ in range(2):  # 40 forged signatures, each verified and refused
            assert store_raw(forger, peer_id, key, tag, forged(good), expiration, copies=20) == [False] * 20
        assert counts()["rejected/bad_signature"] == 40 and counts()["store_senders_rested"] == 1
        # resting: refused without a value verified, even a well-signed one
        assert store_raw(forger, peer_id, key, tag, forged(good), expiration, copies=50) == [False] * 50
        assert signed_store(forger, "forger") == [False]
        assert counts()["rejected/bad_signature"] == 40 and counts()["rejected/sender_rested"] == 51
        assert signed_store(honest, "honest") == [True]  # another peer's store is validated and kept
        wait_until(lambda: not victim.store_gate.resting(forger.node.peer_id.to_base58()), 10)
        assert signed_store(forger, "forger") == [True]  # the rest is over
        assert victim.healthy()
    finally:
        forger.close()
        honest.close()
