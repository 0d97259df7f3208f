"""Stores counted by host, then by peer: a machine that stores under many libp2p identities (a key each) loses its own
values before another host's, and shares one budget per window among its identities. The rules without a network
(the eviction, the host of an address and its book, the host budget), then real DHT peers on three hosts made with
network namespaces."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from hivemind.dht.routing import DHTID
from hivemind.utils.serializer import MSGPackSerializer

from swarm.hivemind_bridge import BoundedStorage
from swarm.peer_hosts import PeerHosts, host_of_ip, is_this_machine
from swarm.records import GroupRecord, encode_record
from swarm.store_gate import StoreGate
from swarm.transport import SwarmCounters
from swarm.validation import record_key
from testbed.hostile_peer import HostileNode, store_raw
from testbed.netns import Hosts, in_namespace
from tests.swarm_fixtures import dht_peers, hosts, make_group, no_p2pd_left_behind, record_p2pd  # noqa: F401


def test_a_full_storage_evicts_from_the_host_holding_most_then_its_peer_holding_most():
    """One host's 20 identities, each holding less than an honest peer of another host, lose their values, not the
    honest peer's (which expire first); within a host, the peer holding most goes first, as before; a peer of unknown
    host and this node's own values are groups of their own."""
    storer: list = [("10.0.0.1", "honest")]
    storage = BoundedStorage(max_values=1000, max_bytes=10_000, storer=lambda: storer[0])
    now = time.time()
    storage.store(DHTID.generate(source="honest"), b"h" * 1500, now + 10)
    storer[0] = None  # this node's own store
    storage.store(DHTID.generate(source="own"), b"o" * 1200, now + 5)
    storer[0] = (None, "unknown-host")
    storage.store(DHTID.generate(source="unknown"), b"u" * 1100, now + 6)
    for n in range(20):  # 20 kB from one host, 1 kB an identity, each expiring after every other value
        storer[0] = ("10.0.0.9", f"sybil-{n}")
        storage.store(DHTID.generate(source=n), b"x" * 1000, now + 100 + n)
        assert storage.nbytes() <= 10_000
    for source in ("honest", "own", "unknown"):
        assert storage.get(DHTID.generate(source=source)) is not None, source
    by_host, by_peer = storage.held_by_host(), storage.held_by()
    assert by_host["10.0.0.1"] == 1500 and by_host[None] == 1200 + 1100 and by_host["10.0.0.9"] <= 10_000 - 3800
    assert by_peer["honest"] == 1500 and by_peer["unknown-host"] == 1100 and by_peer[None] == 1200
    assert sum(1 for peer in by_peer if str(peer).startswith("sybil-")) < 20  # its identities lost theirs

    # within one host: the peer holding most loses its value that expires first, whatever the others expire
    within = BoundedStorage(max_values=1000, max_bytes=5_000, storer=lambda: storer[0])
    storer[0] = ("10.0.0.2", "small")
    within.store(DHTID.generate(source="small"), b"s" * 500, now + 10)
    storer[0] = ("10.0.0.2", "big")
    for n in range(6):
        within.store(DHTID.generate(source=f"big-{n}"), b"b" * 1000, now + 200 + n)
    assert within.get(DHTID.generate(source="small")) is not None
    assert within.get(DHTID.generate(source="big-0")) is None and within.get(DHTID.generate(source="big-5"))

    # the key bound by the same rule: 200 identities of one host storing a tiny value each lose their own keys
    keys = BoundedStorage(max_values=50, max_bytes=10**9, storer=lambda: storer[0])
    storer[0] = ("10.0.0.1", "honest")
    for n in range(3):
        keys.store(DHTID.generate(source=f"entry-{n}"), b"e" * 300, now + 10)
    for n in range(200):
        storer[0] = ("2001:db8::/64", f"tiny-{n}")
        keys.store(DHTID.generate(source=f"tiny-{n}"), b"t", now + 100 + n)
        assert len(keys) <= 50
    assert all(keys.get(DHTID.generate(source=f"entry-{n}")) is not None for n in range(3))


def test_the_host_of_an_address_is_the_ipv4_address_or_the_ipv6_64():
    assert host_of_ip("10.231.0.3") == "10.231.0.3"
    assert host_of_ip("2001:db8:1:2:aaaa::1") == host_of_ip("2001:db8:1:2:ffff::7") == "2001:db8:1:2::/64"
    assert host_of_ip("2001:db8:1:3::1") != host_of_ip("2001:db8:1:2::1")
    assert host_of_ip("::ffff:192.0.2.7") == "192.0.2.7" and host_of_ip("not an address") is None
    assert is_this_machine("127.0.0.1") and is_this_machine(host_of_ip("::1")) and not is_this_machine("10.231.0.3")


class Addr:
    """A multiaddr as the bindings give it: ``addr["ip4"]`` or ``addr["ip6"]``, KeyError for a protocol it lacks."""

    def __init__(self, **parts: str):
        self.parts = parts

    def __getitem__(self, protocol: str) -> str:
        return self.parts[protocol]


def peer_id(name: str) -> SimpleNamespace:
    return SimpleNamespace(to_base58=lambda: name)


def test_peer_hosts_books_the_connected_peers_at_one_listing_and_is_bounded():
    clock = [0.0]
    listed = [
        SimpleNamespace(peer_id=peer_id("a"), addrs=[Addr(ip4="10.0.0.1", tcp="1")]),
        SimpleNamespace(peer_id=peer_id("b"), addrs=[Addr(ip6="2001:db8::5")]),
        SimpleNamespace(peer_id=peer_id("a"), addrs=[Addr(ip4="10.0.0.99")]),  # a second connection: the first counts
        SimpleNamespace(peer_id=peer_id("relay-only"), addrs=[Addr(p2p="x")]),
    ]

    async def list_peers():
        await asyncio.sleep(0)
        return list(listed)

    hosts = PeerHosts(list_peers, ttl=60.0, max_peers=3, clock=lambda: clock[0])

    async def lookups() -> None:
        found = await asyncio.gather(*(hosts.host(peer_id(name)) for name in ("a", "b", "a", "b")))
        assert found == ["10.0.0.1", "2001:db8::/64", "10.0.0.1", "2001:db8::/64"]
        assert hosts.lookups == 1  # four lookups at once: one listing
        assert await hosts.host(peer_id("relay-only")) is None and hosts.lookups == 2  # not booked yet: listed again
        assert await hosts.host(peer_id("relay-only")) is None and hosts.lookups == 2  # booked as hostless
        # arrived before the second listing began (it waited its interval): not listed there, booked as hostless
        assert await hosts.host(peer_id("gone")) is None and hosts.lookups == 2
        assert len(hosts) == 3  # bounded: the one found longest ago left
        clock[0] += 1.5  # hostless is booked for a second only: listed again
        assert await hosts.host(peer_id("gone")) is None and hosts.lookups == 3
        clock[0] += 61  # after the ttl: looked up again
        listed[0] = SimpleNamespace(peer_id=peer_id("a"), addrs=[Addr(ip4="10.0.0.2")])
        assert await hosts.host(peer_id("a")) == "10.0.0.2"

    asyncio.run(lookups())


def test_identities_connecting_while_a_listing_runs_wait_for_one_next_listing_not_one_each():
    # One machine dialing fresh libp2p keys: each key's first request finds the key missing from the listing under
    # way (begun before it connected). The node lists its connections once more for all of them, not once per key.
    clock = [0.0]
    connected = [SimpleNamespace(peer_id=peer_id(f"honest-{i}"), addrs=[Addr(ip4=f"10.0.1.{i}")]) for i in range(200)]
    release, began = asyncio.Event(), asyncio.Event()

    async def list_peers():
        listed = list(connected)  # the connections when the listing began
        began.set()
        await release.wait()  # the daemon answers the first listing only once the new identities arrived
        return listed

    hosts = PeerHosts(list_peers, ttl=60.0, max_peers=4096, clock=lambda: clock[0], min_interval=0.2)

    async def flood() -> None:
        first = asyncio.ensure_future(hosts.host(peer_id("honest-0")))
        await began.wait()  # the first listing is under way
        clock[0] += 0.05
        fresh = [f"fresh-{i}" for i in range(300)]
        connected.extend(SimpleNamespace(peer_id=peer_id(k), addrs=[Addr(ip4="203.0.113.9")]) for k in fresh)
        waiting = [asyncio.ensure_future(hosts.host(peer_id(k))) for k in fresh]
        await asyncio.sleep(0)
        release.set()
        assert await first == "10.0.1.0"
        assert await asyncio.gather(*waiting) == ["203.0.113.9"] * 300  # each found its host ...
        assert hosts.lookups == 2  # ... in one listing more, begun after they connected

    asyncio.run(flood())


def stored(gate: StoreGate, sender: str, host: str | None, values: int) -> list[bool] | str:
    """One store request of ``values`` one-byte values from ``sender`` on ``host`` through ``gate``."""

    async def rpc_store(request, context):
        return [True] * values

    async def host_of(peer):
        return host

    handler = gate.wrap(rpc_store, lambda request: "refused unverified", host_of=host_of)
    request = SimpleNamespace(keys=[b"k"] * values, values=[b"v"] * values)
    return asyncio.run(handler(request, SimpleNamespace(remote_id=peer_id(sender))))


def test_the_peers_of_one_host_share_a_budget_and_none_rests_for_it():
    now = [100.0]
    counters = SwarmCounters()
    budget = dict(budget_bytes=10**9, budget_values=10, host_budget_peers=2)
    gate = StoreGate(counters, window=10.0, clock=lambda: now[0], **budget)
    assert stored(gate, "sybil-1", "10.0.0.9", 10) == [True] * 10  # each within its own budget
    assert stored(gate, "sybil-2", "10.0.0.9", 10) == [True] * 10
    assert stored(gate, "sybil-3", "10.0.0.9", 10) == "refused unverified"  # the host's two budgets are spent
    assert stored(gate, "sybil-4", "10.0.0.9", 1) == "refused unverified"
    assert not gate.resting("sybil-3") and counters.snapshot()["rejected/store_host_budget"] == 11
    assert "store_senders_rested" not in counters.snapshot()
    assert stored(gate, "honest", "10.0.0.1", 10) == [True] * 10  # another host's peers are not touched
    assert stored(gate, "unknown-1", None, 10) == [True] * 10  # peers of unknown host share one host's budget
    assert stored(gate, "unknown-2", None, 10) == [True] * 10
    assert stored(gate, "unknown-3", None, 10) == "refused unverified"
    for n in range(5):  # peers of this machine (a swarm on one, loopback): each its own budget only, as before
        assert stored(gate, f"local-{n}", "127.0.0.1", 10) == [True] * 10
    now[0] += 10.5  # the host's window ended
    assert stored(gate, "sybil-3", "10.0.0.9", 10) == [True] * 10


# ------------------------------------------------------------------------------------------------ real peers


def on_host(hosts: Hosts, i: int, initial_peers: list[str]) -> HostileNode:
    """A raw DHT node, a fresh libp2p identity, on host ``i``."""
    return in_namespace(
        hosts.names[i],
        lambda: HostileNode(initial_peers, on_p2pd=record_p2pd, host_maddr=f"/ip4/{hosts.address(i)}/tcp/0"),
    )


@pytest.mark.usefixtures("no_p2pd_left_behind")
def test_a_hoarder_with_many_identities_on_one_host_evicts_its_own_records_not_another_hosts(hosts, dht_peers):
    """A receiver on host 0; an honest peer on host 1 stores two records that expire first; a hoarder on host 2 stores
    one record from each of five fresh libp2p identities (each far under its budget, each holding less than the
    honest peer), overflowing the receiver's storage: the hoarder's identities lose theirs, the honest records stay.
    Counted per identity (before), the honest peer held most and lost its records first."""
    receiver = in_namespace(
        hosts.names[0],
        lambda: dht_peers(
            host_maddrs=[f"/ip4/{hosts.address(0)}/tcp/0"], check_reachability=False, dht_storage_bytes=200_000
        ),
    )
    joined, nodes = receiver.visible_addresses(), []
    try:
        honest = on_host(hosts, 1, joined)
        nodes.append(honest)
        hoarders = [on_host(hosts, 2, joined) for _ in range(5)]
        nodes.extend(hoarders)
        target, dumps = receiver.peer.libp2p_peer_id, MSGPackSerializer.dumps
        group = make_group("g", completion_chars=10_000, completions=4)
        record = dumps(encode_record(GroupRecord([group], created_at=time.time())))
        assert 40_000 < len(record) < 45_000

        def store(node: HostileNode, name: str, expiration: float) -> str:
            key = record_key("sapo", name, 1)
            value = node.signed(key, node.marker, record, expiration)
            assert store_raw(node, target, key, dumps(node.marker), value, expiration) == [True]
            return key

        honest_keys = [store(honest, f"honest-{n}", time.time() + 60) for n in range(2)]
        hoarded = [store(node, f"hoard-{n}", time.time() + 120 + n) for n, node in enumerate(hoarders)]
        storage = receiver.peer.node.protocol.storage
        for key in honest_keys:
            assert storage.get(DHTID.generate(source=key)) is not None, "an honest record was evicted"
        held = storage.held_by_host()
        assert 2 * len(record) < held[hosts.address(1)] < 2 * len(record) + 2048  # both its records, its own host
        lost = [key for key in hoarded if storage.get(DHTID.generate(source=key)) is None]
        assert len(lost) >= 2 and held[hosts.address(2)] <= 200_000 - held[hosts.address(1)]
        assert receiver.readout().gauges["dht_stored_bytes"] <= 200_000
        assert receiver.healthy()
    finally:
        for node in nodes:
            node.close()
