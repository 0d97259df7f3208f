"""The serve gate: a libp2p peer's record requests take a budget of requests and answer bytes per window, a record is
answered again only a few times (a reader's retries), the peers of one host share a budget, and a peer beyond its
budget rests; readers still fetch records from their publishers. The rules on a manual clock, the handler with a fake
context, then a real publisher on 127.0.0.1 asked for one record over and over."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from google.protobuf.wrappers_pb2 import BytesValue

from swarm.records import REJECT_REASONS
from swarm.serve_gate import SERVE_BUDGET_BYTES, SERVE_REPEATS, ServeGate
from swarm.served import RECORD_HANDLER, ServedRecords, SignedRecord, decode_answer, encode_answer
from swarm.transport import SwarmCounters, wait_for_groups
from testbed.hostile_peer import HostileNode
from tests.swarm_fixtures import GateClock as Clock
from tests.swarm_fixtures import dht_peers, make_group, no_p2pd_left_behind, record_p2pd  # noqa: F401


def test_a_peer_beyond_its_requests_or_bytes_rests_doubling_and_others_are_answered():
    clock, counters = Clock(), SwarmCounters()
    gate = ServeGate(counters, budget_requests=10, budget_bytes=1000, window=10.0, rest=30.0, clock=clock)
    for n in range(10):  # ten requests, misses and answers alike: within
        assert gate.admit("reader", b"key-%d" % n, None if n % 2 else 50)
    assert not gate.admit("reader", b"key-10", None) and gate.resting("reader")  # the 11th: rests
    assert not gate.admit("reader", b"key-0", 50) and gate.admit("other", b"key-0", 50)
    assert counters.snapshot() == {"rejected/serve_budget": 1, "rejected/serve_rested": 1, "served_senders_rested": 1}
    clock.now += 30.5  # the rest ended: a fresh window
    assert not gate.resting("reader")
    assert gate.admit("reader", b"a", 600) and gate.admit("reader", b"b", 400)  # 1000 bytes: within
    assert not gate.admit("reader", b"c", 1) and gate.resting("reader")  # a byte more: rests again, 60 s
    clock.now += 59
    assert gate.resting("reader")
    clock.now += 2
    assert not gate.resting("reader") and gate.admit("reader", b"c", 1)
    # a window that ended counts afresh, without a rest
    clock.now += 10.5
    assert all(gate.admit("reader", b"k%d" % n, 100) for n in range(10))
    assert counters.snapshot()["served_senders_rested"] == 2


def test_a_record_asked_again_is_answered_a_few_times_then_the_peer_rests():
    clock, counters = Clock(), SwarmCounters()
    gate = ServeGate(counters, max_repeats=2, clock=clock)
    assert gate.admit("reader", b"record", 100)
    # an honest reader's retries after a failed fetch (the answer lost or late) are answered in full
    assert gate.admit("reader", b"record", 100) and gate.admit("reader", b"record", 100)
    assert gate.admit("reader", b"other", 100)  # a record not answered before is no repeat
    assert gate.admit("reader", b"missing", None) and gate.admit("reader", b"missing", None)  # misses cost nothing
    assert not gate.admit("reader", b"record", 100) and gate.resting("reader")  # the third repeat: rests
    assert counters.snapshot() == {"rejected/serve_repeat": 1, "served_senders_rested": 1}
    assert gate.admit("another", b"record", 100)  # counted per peer
    clock.now += 40.0  # after the rest, the same record is answered again
    assert gate.admit("reader", b"record", 100) and gate.admit("reader", b"record", 100)
    assert {"serve_budget", "serve_repeat", "serve_rested", "serve_host_budget"} <= set(REJECT_REASONS)


def test_the_peers_of_one_host_share_a_budget_without_resting_and_loopback_is_exempt():
    clock, counters = Clock(), SwarmCounters()
    gate = ServeGate(counters, budget_requests=5, budget_bytes=10**6, host_budget_peers=2, clock=clock)
    # fresh identities on one host: ten requests in all, then refused until the window ends; nobody rests
    for n in range(10):
        assert gate.admit(f"identity-{n}", b"record", 10, host="203.0.113.7")
    assert not gate.admit("identity-10", b"record", 10, host="203.0.113.7")
    assert not any(gate.resting(f"identity-{n}") for n in range(11))
    assert gate.admit("elsewhere", b"record", 10, host="198.51.100.1")  # another host has its own
    assert all(gate.admit(f"local-{n}", b"record", 10, host="127.0.0.1") for n in range(20))  # this machine's
    assert counters.snapshot() == {"rejected/serve_host_budget": 1}
    clock.now += 10.5
    assert gate.admit("identity-10", b"record", 10, host="203.0.113.7")
    # bytes too: two peers' budgets of bytes a window
    gate = ServeGate(counters, budget_bytes=1000, host_budget_peers=2, clock=clock)
    assert gate.admit("a", b"r1", 900, host="203.0.113.8") and gate.admit("b", b"r1", 900, host="203.0.113.8")
    assert not gate.admit("c", b"r1", 900, host="203.0.113.8") and gate.admit("c", b"r2", 100, host="203.0.113.8")


def test_the_gated_handler_answers_empty_and_encodes_nothing_for_a_refused_request():
    counters, clock = SwarmCounters(), Clock()
    served = ServedRecords(None, 4, counters)
    served.put("sapo/records/x/1", SignedRecord(b"v" * 5000, time.time() + 600))
    hosts: list[str] = []

    async def host_of(peer_id):
        hosts.append(peer_id.to_base58())
        return "127.0.0.1"

    handler = ServeGate(counters, max_repeats=1, clock=clock).wrap(served, host_of)

    def ask(key: bytes, asker: str = "asker") -> bytes:
        context = SimpleNamespace(remote_id=SimpleNamespace(to_base58=lambda: asker))
        return asyncio.run(handler(BytesValue(value=key), context)).value

    first = decode_answer(ask(b"sapo/records/x/1"), 1 << 20)
    assert first is not None and first.value == b"v" * 5000
    assert decode_answer(ask(b"sapo/records/x/1"), 1 << 20) == first  # a retry
    assert ask(b"sapo/records/x/9") == b"" and ask(b"x" * 2000) == b""  # misses
    assert ask(b"sapo/records/x/1") == b""  # a second repeat: rests
    served.lookup = None  # a resting peer's request looks nothing up (and its host is not asked)
    assert ask(b"sapo/records/x/1") == b"" and len(hosts) == 5
    snapshot = counters.snapshot()
    assert snapshot["served_requests"] == 2 and snapshot["served_bytes"] == 2 * len(encode_answer(first))
    assert snapshot["served_misses"] == 2 and snapshot["served_senders_rested"] == 1
    assert snapshot["rejected/serve_repeat"] == 1 and snapshot["rejected/serve_rested"] == 1


@pytest.mark.usefixtures("no_p2pd_left_behind")
def test_a_real_publisher_asked_for_one_record_over_and_over_sends_it_a_few_times_and_serves_a_reader(dht_peers):
    publisher = dht_peers()
    publisher.publish([make_group("big", completion_chars=4000, completions=25)])
    deadline = time.time() + 30
    while not publisher.served.live() and time.time() < deadline:
        time.sleep(0.1)
    [(key, record)] = publisher.served.live()
    assert 90_000 < len(record.value) < 120_000
    attacker = HostileNode(publisher.visible_addresses(), on_p2pd=record_p2pd)
    try:
        asks, got = 200, 0
        for _ in range(asks):  # about 80 bytes asked each time, the key public in the publisher's index entry
            answer = attacker.run(
                attacker.node.p2p.call_protobuf_handler(
                    publisher.peer.libp2p_peer_id, RECORD_HANDLER, BytesValue(value=key.encode()), BytesValue
                )
            )
            got += len(answer.value)
        counters = publisher.readout().counters
        # ungated, 200 answers (20 MB); now the record once and its retries, then the attacker rests
        assert got == counters["served_bytes"] <= (1 + SERVE_REPEATS) * (len(record.value) + 16) < SERVE_BUDGET_BYTES
        assert counters["served_requests"] == 1 + SERVE_REPEATS
        assert counters["served_senders_rested"] == 1 and counters["rejected/serve_repeat"] == 1
        assert counters["rejected/serve_rested"] == asks - 2 - SERVE_REPEATS
        # an honest reader still fetches the record from its publisher
        reader = dht_peers(initial_peers=publisher.visible_addresses())
        assert wait_for_groups(reader, 1, timeout=30) == 1
        assert {item.group.group_id for item in reader.fetch(10)} == {"big"}
        assert publisher.readout().counters["served_requests"] == 2 + SERVE_REPEATS
        assert publisher.healthy()
    finally:
        attacker.close()
