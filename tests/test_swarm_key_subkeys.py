"""One key's dictionary (an index shard) bounded in subkeys, the host holding the most of them trimmed first: one host
storing index entries of more identities under one index key than a reader takes (4096) made every honest holder's
answer for that shard unreadable. The rule without a network, then real DHT peers on three hosts made with network
namespaces: a flooding host's entries beyond the bound go, an honest peer's entry stays, and a reader reads the shard
(with the bound and the reader's limit scaled down from 1024 and 4096 to 16 and 24: the rule is the same)."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import time

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.serializer import MSGPackSerializer

from swarm.hivemind_bridge import BoundedStorage
from swarm.records import RecordRejected
from swarm.storage_eviction import trim_subkeys
from swarm.validation import index_key_of
from testbed.netns import in_namespace
from testbed.shard_flood import index_entry, store_entries
from tests.swarm_fixtures import dht_peers, hosts, no_p2pd_left_behind, record_p2pd  # noqa: F401
from tests.test_swarm_store_hosts import on_host


def test_a_key_over_its_subkeys_trims_the_host_holding_most_of_them():
    """Past the bound the key keeps 7/8 of it: the host holding most subkeys of the key loses, of its peer holding
    most, the subkey that expires first, again and again; an honest host's entry (expiring first), a peer of unknown
    host, this node's own entry and loopback peers (each a group of its own, as the store budget counts them) stay."""
    expirations: dict[str, float] = {"honest": 1.0, "unlisted": 2.0, "own": 3.0, "local-a": 4.0, "local-b": 4.5}
    storers = {
        "honest": ("10.0.0.1", "h"),
        "unlisted": (None, "u"),
        "own": None,
        "local-a": ("127.0.0.1", "la"),
        "local-b": ("127.0.0.1", "lb"),
    }
    for n in range(60):  # one host, 20 identities of three entries each, every one expiring after the others
        expirations[f"flood-{n}"] = 100.0 + n
        storers[f"flood-{n}"] = ("10.0.0.9", f"sybil-{n % 20}")
    removed: list[str] = []

    def remove(subkey: str) -> None:
        removed.append(subkey)
        del expirations[subkey]

    assert trim_subkeys(dict(expirations), storers.get, 100, remove) == 0  # within the bound: nothing
    assert trim_subkeys(dict(expirations), storers.get, 32, remove) == len(removed) == 65 - 28
    assert all(subkey.startswith("flood-") for subkey in removed) and len(expirations) == 28
    assert {"honest", "unlisted", "own", "local-a", "local-b"} <= set(expirations)
    # within the host its identities were evened out, each losing its entry that expires first
    held = [sum(1 for s in expirations if s.startswith("flood-") and int(s[6:]) % 20 == n) for n in range(20)]
    assert max(held) - min(held) <= 1
    assert "flood-0" in removed and "flood-59" in expirations

    # two flooding hosts: the larger loses first, until they hold as many; the honest host holding fewer loses none
    expirations = {"honest": 1.0, **{f"a-{n}": 50.0 + n for n in range(30)}, **{f"b-{n}": 10.0 + n for n in range(10)}}
    storers = {"honest": ("10.0.0.1", "h")}
    storers.update({f"a-{n}": ("10.0.0.7", "a") for n in range(30)})
    storers.update({f"b-{n}": ("2001:db8::/64", "b") for n in range(10)})
    removed.clear()
    trim_subkeys(dict(expirations), storers.get, 24, remove)
    assert "honest" in expirations and len(expirations) == 21
    assert sum(s.startswith("a-") for s in expirations) == 10 and sum(s.startswith("b-") for s in expirations) == 10


def test_the_storage_keeps_a_keys_dictionary_within_its_bound_whichever_way_it_grows():
    """A store of one subkey, a whole dictionary cached, or a lookup's merge into the dictionary held (trimmed before
    a find answers for it): the key never answers more than the bound, the honest entry stays, trims are counted."""
    storer: list = [("10.0.0.1", "honest")]
    trimmed: list[int] = []
    storage = BoundedStorage(10_000, 10**9, lambda: storer[0], max_subkeys=16, on_subkeys_trimmed=trimmed.append)
    key, now = DHTID.generate(source="sapo/index/3"), time.time()
    storage.store_subkey(key, b"honest", b"h" * 300, now + 10)
    for n in range(200):
        storer[0] = ("10.0.0.9", f"sybil-{n}")
        storage.store_subkey(key, f"s-{n}".encode(), b"x" * 300, now + 100 + n)
        assert len(storage.get(key).value) <= 16
    assert b"honest" in storage.get(key).value.data and sum(trimmed) == 201 - len(storage.get(key).value)
    assert storage.held_by_host()["10.0.0.9"] <= 15 * 304  # the evicted subkeys are forgotten too

    merged = DictionaryDHTValue()
    for n in range(40):
        merged.store(f"m-{n}".encode(), b"y", now + 50 + n)
    cache = BoundedStorage(10_000, 10**9, max_subkeys=16)
    cache.store(key, merged, now + 90)  # a lookup's result, cached whole
    assert len(cache.get(key).value) == 14
    for n in range(40):  # a later lookup merges more into the very dictionary held
        cache.get(key).value.store(f"late-{n}".encode(), b"z", now + 200 + n)
    assert cache.trim_key(key) > 0 and len(cache.get(key).value) == 14
    assert storage.trim_key(DHTID.generate(source="nothing")) == 0


# ------------------------------------------------------------------------------------------------ real peers


@pytest.mark.usefixtures("no_p2pd_left_behind")
def test_a_host_flooding_an_index_shard_with_identities_leaves_it_readable(hosts, dht_peers):
    """A holder on host 0 (16 subkeys a key); an honest peer on host 1 stores its index entry, which expires first; a
    flooding host 2 stores 40 entries of 40 identities (signing keys) under the same index key from one libp2p peer,
    within its store budget. A reader on host 1, whose typed decoding takes at most 24 items a dictionary (its own
    dht_key_subkeys; 1024 in a real swarm), looks the key up: it reads a dictionary of at most 16 entries holding the
    honest one. Before, the holder answered all 41 (and its own), the reader refused the answer whole, and the lookup
    found no honest entry (at most the reader's own)."""
    holder = in_namespace(
        hosts.names[0],
        lambda: dht_peers(host_maddrs=[f"/ip4/{hosts.address(0)}/tcp/0"], check_reachability=False, dht_key_subkeys=16),
    )
    joined, nodes = holder.visible_addresses(), []
    try:
        reader = in_namespace(
            hosts.names[1],
            lambda: dht_peers(
                initial_peers=joined,
                host_maddrs=[f"/ip4/{hosts.address(1)}/tcp/0"],
                check_reachability=False,
                dht_key_subkeys=24,
            ),
        )
        honest = on_host(hosts, 1, joined)
        nodes.append(honest)
        flooder = on_host(hosts, 2, joined)
        nodes.append(flooder)
        target = holder.peer.libp2p_peer_id
        key = index_key_of(holder.config.swarm_name, holder.config.index_shards, 0, "honest")
        now = time.time()
        honest_entry = index_entry(honest.signer, key, now + 60)
        assert store_entries(honest, target, key, [honest_entry], [now + 60]) == [True]
        identities = [RSASignatureValidator(RSAPrivateKey()) for _ in range(40)]
        flood = [index_entry(signer, key, now + 120 + n) for n, signer in enumerate(identities)]
        assert all(store_entries(flooder, target, key, flood, [now + 120 + n for n in range(40)]))

        held = holder.peer.node.protocol.storage.get(DHTID.generate(source=key)).value
        assert honest.marker in held.data, "the honest entry was trimmed"
        assert len(held) <= 16
        assert holder.readout().counters["dht_subkeys_trimmed"] >= 40 + 1 - 16

        started = time.perf_counter()
        found = asyncio.run_coroutine_threadsafe(reader.peer.node.get(key, latest=True), reader.peer.loop).result(30)
        took = time.perf_counter() - started
        assert found is not None, f"the reader found nothing for the shard ({took:.2f} s)"
        read = found.value
        assert honest.marker in read and len(read) <= 16, len(read)
        print(f"reader's lookup: {took:.3f} s, {len(read)} entries, the honest one among them")
        # the reader takes a dictionary of at most its own dht_key_subkeys items: a larger answer is refused whole
        larger = DictionaryDHTValue()
        for n in range(25):
            larger.store(f"[owner:{n}]".encode(), b"v", now + 60)
        with pytest.raises(RecordRejected):
            reader.peer.node.protocol.serializer.loads(MSGPackSerializer.dumps(larger))
        assert holder.healthy() and reader.healthy()
    finally:
        for node in nodes:
            node.close()
