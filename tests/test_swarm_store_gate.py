"""The store gate (issue 61): a libp2p peer whose stored values are mostly refused, or that stores beyond its budget of
bytes or values per window, rests, its stores then refused without a value decoded or verified, while other peers'
stores (and its own, once the rest ends) are validated as before; and the DHT's storage is bounded in bytes whoever
stores. The rules on a manual clock, then on real DHT peers on 127.0.0.1."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import base64
import os
import time
from types import SimpleNamespace

import pytest
from hivemind.dht.routing import DHTID
from hivemind.utils.serializer import MSGPackSerializer

from swarm.hivemind_bridge import BoundedStorage
from swarm.records import GroupRecord, encode_record
from swarm.rest_book import EVICTION_SCAN, RestBook, SenderWindow
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


def store(gate: StoreGate, sender: str, values: int, refused: int, value_bytes: int = 1) -> list[bool] | str:
    """One store request of ``values`` values of ``value_bytes`` bytes through ``gate``, its validators refusing the
    first ``refused``."""

    async def rpc_store(request, context):
        assert STORE_REQUEST.get().sender == sender  # the validators know whom a refusal counts against
        for _ in range(refused):
            gate.refused()
        return [True] * (values - refused)

    handler = gate.wrap(rpc_store, lambda request: "refused unverified")
    request = SimpleNamespace(keys=[b"k"] * values, values=[b"v" * value_bytes] * values)
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
    request = SimpleNamespace(keys=[b"k"] * 40, values=[b"v"] * 40)
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


class _CountedWindow(SenderWindow):
    """A window that counts how often a book read its rest: what an eviction looked through."""

    reads = 0

    @property
    def rests_until(self) -> float:
        _CountedWindow.reads += 1
        return self._rests_until

    @rests_until.setter
    def rests_until(self, value: float) -> None:
        self._rests_until = value


def test_a_book_full_of_resting_peers_looks_through_a_bounded_number_for_each_newcomer():
    # 4,096 identities made to rest, then a stream of new ones (announcements' originators need no connection):
    # each newcomer pushes one entry out after reading at most EVICTION_SCAN of them, not all 4,096.
    clock = Clock()
    book = RestBook(lambda at: _CountedWindow(window_began=at), window=10.0, rest=30.0, max_senders=4096, clock=clock)
    for n in range(4096):
        book.start_rest(book.entry(f"rested-{n}"))
    assert book.resting("rested-0") and len(book) == 4096
    _CountedWindow.reads = 0
    for n in range(1000):
        book.entry(f"fresh-{n}")
    assert len(book) == 4096 and _CountedWindow.reads <= 1000 * EVICTION_SCAN
    # every one of the oldest rested: the oldest went (an identity's rest is worth little against a maker of them)
    assert not book.resting("rested-999") and book.resting("rested-1000") and book.resting("rested-4095")


def test_a_sender_storing_valid_values_beyond_its_byte_budget_rests_and_its_rests_double():
    clock, counters = Clock(), SwarmCounters()
    gate = StoreGate(counters, window=10.0, rest=30.0, budget_bytes=1000, budget_values=100, clock=clock)
    for _ in range(9):  # 900 bytes in the window, every value valid: within the budget, all stored
        assert store(gate, "hoarder", 1, 0, value_bytes=100) == [True]
    assert store(gate, "hoarder", 2, 0, value_bytes=100) == "refused unverified"  # 1100 > 1000: not kept
    assert gate.resting("hoarder") and store(gate, "hoarder", 1, 0, value_bytes=1) == "refused unverified"
    snapshot = counters.snapshot()
    assert snapshot["rejected/store_budget"] == 2 and snapshot["rejected/sender_rested"] == 1
    assert snapshot["store_senders_rested"] == 1
    assert store(gate, "other", 9, 0, value_bytes=100) == [True] * 9  # each sender has a budget of its own
    clock.now += 30.5  # the rest is over: a fresh budget, and the next rest lasts twice as long
    assert store(gate, "hoarder", 1, 0, value_bytes=1000) == [True]
    assert store(gate, "hoarder", 1, 0, value_bytes=1) == "refused unverified"
    clock.now += 59
    assert gate.resting("hoarder")
    clock.now += 2
    assert not gate.resting("hoarder") and counters.snapshot()["store_senders_rested"] == 2


def test_the_value_budget_counts_values_and_each_window_starts_afresh():
    clock = Clock()
    gate = StoreGate(SwarmCounters(), window=10.0, budget_bytes=10**9, budget_values=50, clock=clock)
    for _ in range(20):  # 50 values a window, every window: never over
        assert store(gate, "steady", 50, 0) == [True] * 50
        clock.now += 10.5
    assert not gate.resting("steady")
    assert store(gate, "burst", 50, 0) == [True] * 50 and store(gate, "burst", 1, 0) == "refused unverified"
    assert gate.resting("burst")


def test_no_budget_limits_nothing_and_refused_values_count_into_the_budget():
    clock = Clock()
    unlimited = StoreGate(SwarmCounters(), min_refused=10**6, clock=clock)  # the defaults: no budget
    assert store(unlimited, "big", 1000, 0, value_bytes=10_000) == [True] * 1000 and not unlimited.resting("big")
    gate = StoreGate(SwarmCounters(), min_refused=10**6, budget_bytes=1000, clock=clock)
    assert store(gate, "mixed", 8, 8, value_bytes=100) == []  # refused, yet received: 800 bytes of the budget
    assert store(gate, "mixed", 3, 0, value_bytes=100) == "refused unverified" and gate.resting("mixed")


def test_bounded_storage_keeps_at_most_its_bytes_and_keys_dropping_what_expires_first():
    storage = BoundedStorage(max_values=1000, max_bytes=10_000)
    now = time.time()
    for n in range(50):  # 50 values of 1000 bytes, each expiring later than the one before
        assert storage.store(DHTID.generate(source=n), b"x" * 1000, now + 100 + n)
        assert storage.nbytes() <= 10_000
    held = {n for n in range(50) if DHTID.generate(source=n) in storage}
    assert held and max(held) == 49 and min(held) > 50 - 10  # the latest-expiring are kept
    for n in range(20):  # subkeys of one dictionary count too, and the dictionary goes whole when it expires first
        storage.store_subkey(DHTID.generate(source="dict"), f"owner-{n}".encode(), b"y" * 500, now + 50)
        assert storage.nbytes() <= 10_000
    few = BoundedStorage(max_values=5, max_bytes=10**9)
    for n in range(20):
        few.store(DHTID.generate(source=n), b"z", now + 100 + n)
        assert len(few) <= 5
    assert DHTID.generate(source=19) in few and DHTID.generate(source=0) not in few
    adopted = BoundedStorage(max_values=1000, max_bytes=3_000)
    adopted.adopt(storage)  # what a node held before its storage was replaced, within the new bounds
    assert 0 < adopted.nbytes() <= 3_000


def test_a_full_storage_evicts_from_whoever_holds_most_not_the_small_values_that_expire_first():
    """A peer that stores valid values by the kilobyte, each expiring late, fills the storage: what goes is its own,
    while two small holders' values, which expire sooner, stay (values of a key's dictionary counted one by one, to
    whoever stored each), until a holder has no more than the others. The same for the number of keys."""
    storer = ["honest-1"]  # every peer on one host: weighed against each other by what each holds
    storage = BoundedStorage(max_values=1000, max_bytes=10_000, storer=lambda: ("10.0.0.1", storer[0]))
    now = time.time()
    storage.store(DHTID.generate(source="honest"), b"h" * 300, now + 10)
    shard = DHTID.generate(source="index-shard")
    storage.store_subkey(shard, b"honest-1", b"e" * 200, now + 10)
    storer[0] = "honest-2"
    storage.store_subkey(shard, b"honest-2", b"e" * 200, now + 10)
    storer[0] = "hoarder"
    for n in range(40):  # 40 kB against a bound of 10 kB, each value expiring after every honest one
        storage.store(DHTID.generate(source=n), b"x" * 1000, now + 100 + n)
        storage.store_subkey(shard, f"hoard-{n}".encode(), b"y" * 20, now + 100 + n)
        assert storage.nbytes() <= 10_000
    assert storage.get(DHTID.generate(source="honest")) is not None
    entries = storage.get(shard).value
    assert entries.get(b"honest-1") is not None and entries.get(b"honest-2") is not None
    held = storage.held_by()
    assert held["honest-1"] == 300 + 8 + 200 and held["honest-2"] == 8 + 200 and held["hoarder"] <= 10_000 - 716
    assert min(n for n in range(40) if DHTID.generate(source=n) in storage) > 30  # its latest kept, as before
    storer[0] = "honest-1"  # a holder over the others loses its own value that expires first
    storage.store(DHTID.generate(source="big"), b"b" * 9_000, now + 1000)
    assert storage.get(DHTID.generate(source="honest")) is None and storage.nbytes() <= 10_000
    # the key bound by the same rule: a peer storing tiny values under key after key evicts its own keys
    keys = BoundedStorage(max_values=50, max_bytes=10**9, storer=lambda: ("10.0.0.1", storer[0]))
    storer[0] = "honest"
    keys.store(DHTID.generate(source="entry"), b"e" * 300, now + 10)
    storer[0] = "hoarder"
    for n in range(200):
        keys.store(DHTID.generate(source=f"tiny-{n}"), b"t", now + 100 + n)
        assert len(keys) <= 50
    assert keys.get(DHTID.generate(source="entry")) is not None and keys.held_by()["honest"] == 300


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


def collect_groups(peer, want: int) -> list:
    """Fetch from ``peer`` until ``want`` groups arrived (AssertionError after 60 s)."""
    received: list = []
    wait_until(lambda: received.extend(peer.fetch(want - len(received))) or len(received) >= want, 60)
    return received


def hoard(node: HostileNode, peer_id, record: bytes, count: int, first: int = 0) -> list[bool]:
    """``count`` valid records signed by ``node``, each under a fresh key (any key: nothing ties a record to the key of
    its owner's records) and expiring later than the one before, stored one by one at the libp2p peer ``peer_id``."""
    answers, dumps = [], MSGPackSerializer.dumps
    for n in range(first, first + count):
        key, expiration = record_key("sapo", f"hoard-{os.urandom(4).hex()}", n), time.time() + 120 + n
        answers += store_raw(node, peer_id, key, dumps(node.marker), node.signed(key, node.marker, record, expiration),
                             expiration)  # fmt: skip
    return answers


@pytest.mark.usefixtures("no_p2pd_left_behind")
def test_a_peer_storing_valid_records_beyond_its_budget_rests_and_the_storage_stays_bounded(dht_peers):
    budget, bound = 300_000, 800_000
    victim = dht_peers(store_budget_bytes=budget, dht_storage_bytes=bound)
    hoarder = HostileNode(victim.visible_addresses(), on_p2pd=record_p2pd)
    fresh = HostileNode(victim.visible_addresses(), on_p2pd=record_p2pd)
    honest = HostileNode(victim.visible_addresses(), on_p2pd=record_p2pd)
    try:
        peer_id = victim.peer.libp2p_peer_id
        group = make_group("g", completion_chars=10_000, completions=4)
        record = MSGPackSerializer.dumps(encode_record(GroupRecord([group], created_at=time.time())))
        assert 40_000 < len(record) < 45_000
        answers = hoard(hoarder, peer_id, record, 12)  # ~500 KB of valid records: over the 300 KB budget
        kept = answers.count(True)
        assert answers == [True] * kept + [False] * (12 - kept) and 5 <= kept <= 7
        counters = victim.readout().counters
        assert counters["rejected/store_budget"] == 1 and counters["rejected/sender_rested"] == 12 - kept - 1
        assert counters["store_senders_rested"] == 1 and "rejected/bad_signature" not in counters
        assert victim.store_gate.resting(hoarder.node.peer_id.to_base58())
        assert kept * len(record) <= victim.readout().gauges["dht_stored_bytes"] <= budget + 2 * 4096
        # identities are free: with no budget, one peer stores 1.3 MB, and the storage still holds at most its bound,
        # made of that peer's records: an honest peer's record stored before, expiring before any of them, stays
        honest_key, expiration, dumps = record_key("sapo", "honest", 1), time.time() + 60, MSGPackSerializer.dumps
        honest_value = honest.signed(honest_key, honest.marker, record, expiration)
        assert store_raw(honest, peer_id, honest_key, dumps(honest.marker), honest_value, expiration) == [True]
        victim.store_gate.budget_bytes = None
        assert hoard(fresh, peer_id, record, 30, first=100) == [True] * 30
        gauges = victim.readout().gauges
        assert bound * 3 // 4 <= gauges["dht_stored_bytes"] <= bound
        assert gauges["dht_stored_items"] < kept + 30  # the largest holder's records made room
        assert victim.peer.node.protocol.storage.get(DHTID.generate(source=honest_key)) is not None
        assert victim.healthy()
    finally:
        hoarder.close()
        fresh.close()
        honest.close()


@pytest.mark.usefixtures("no_p2pd_left_behind")
def test_an_honest_peer_publishing_at_its_rate_never_rests(dht_peers):
    victim = dht_peers()
    publisher = dht_peers(initial_peers=victim.visible_addresses(), serve_records=False, model_name="honest")
    for step in range(30):  # a record every poll interval (0.1 s here), of 4 groups of 8 completions: ~70 KB each
        publisher.publish([make_group(f"{step}-{n}", completion_chars=2000, completions=8) for n in range(4)])
        time.sleep(0.1)
    # every record stored (on the victim too: with two peers and two replicas, both hold each), none refused
    wait_until(lambda: publisher.readout().counters.get("published_records", 0) == 30, 60, message="published")
    assert "publish_failures" not in publisher.readout().counters
    assert 30 * 60_000 <= victim.readout().gauges["dht_stored_bytes"] <= victim.config.dht_storage_bytes
    assert len(collect_groups(victim, 16)) == 16  # and read
    for peer in (victim, publisher):
        counters = peer.readout().counters
        assert "store_senders_rested" not in counters and "rejected/store_budget" not in counters, counters
