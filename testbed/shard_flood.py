"""One host flooding an index shard with the entries of thousands of identities, at an honest holder, then a reader's
lookup of that shard: whether the honest peer's entry is read, and what it costs.

Three hosts in network namespaces (:class:`testbed.netns.Hosts`, needs root): the holder (a ``DHTTransport``) on host
0; an honest peer's raw node and the reader (a ``DHTTransport``) on host 1; on host 2, four libp2p identities of one
flooding host, each storing the signed index entries of ``--identities / 4`` identities (a signing key each) under the
honest peer's level-0 index key, within the host's store budget (4 peers x 1024 values per 10 s). Before the bound a
reader took a dictionary of at most 4096 items (:data:`swarm.dht_values.MAX_DICTIONARY_ITEMS`), so 4096 flooding
entries and the honest one made the holder's answer one too many; a reader now takes at most its own
``dht_key_subkeys``. The signing keys take about 45 ms each to make: ``--keys PATH``
keeps them for the next run. The helpers are the test's too (``tests/test_swarm_key_subkeys.py``).

    python -m testbed.shard_flood --keys /tmp/shard_flood_keys.pkl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import time
from typing import Any

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.proto import dht_pb2
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.serializer import MSGPackSerializer

from swarm.records import IndexEntry, RecordRef, encode_index_entry

FLOODERS = 4
"""libp2p identities of the flooding host: its host shares four peers' store budgets (store_budget_host_peers)."""


def index_entry(signer: RSASignatureValidator, key: str, expiration: float) -> tuple[bytes, bytes]:
    """An honest-looking index entry of the identity ``signer`` under ``key``: its subkey (the owner marker, packed)
    and its signed value, as hivemind sends them."""
    entry = encode_index_entry(IndexEntry(model="m", records=[RecordRef(1, time.time(), 1)], updated_at=time.time()))
    value = MSGPackSerializer.dumps(entry)
    subkey = MSGPackSerializer.dumps(signer.local_public_key)
    return subkey, signer.sign_value(DHTRecord(DHTID.generate(source=key).to_bytes(), subkey, value, expiration))


def store_entries(
    node: Any, target: Any, key: str, entries: list[tuple[bytes, bytes]], expirations: list[float]
) -> list[bool]:
    """One store request from the raw node ``node`` (:class:`testbed.hostile_peer.HostileNode`) to the libp2p peer
    ``target``: each entry as a subkey of ``key``; the holder's answers."""
    request = dht_pb2.StoreRequest(
        keys=[DHTID.generate(source=key).to_bytes()] * len(entries),
        subkeys=[subkey for subkey, _ in entries],
        values=[value for _, value in entries],
        expiration_time=expirations,
        in_cache=[False] * len(entries),
        peer=node.node.protocol.node_info,
    )
    return list(node.run(node.node.protocol.get_stub(target).rpc_store(request, timeout=60), timeout=90).store_ok)


def signing_keys(count: int, path: str | None) -> list[RSAPrivateKey]:
    """``count`` swarm keys, read from ``path`` (their DER bytes) where it holds enough, else made (and kept there)."""
    from cryptography.hazmat.primitives import serialization

    from swarm.hivemind_bridge import signing_key

    if path and os.path.exists(path):
        with open(path, "rb") as f:
            ders = pickle.load(f)
        if len(ders) >= count:  # loaded without the consistency check (about 45 ms a key): this tool made them
            load = serialization.load_der_private_key
            return [signing_key(load(der, None, unsafe_skip_rsa_key_validation=True)) for der in ders[:count]]
    made = [RSAPrivateKey() for _ in range(count)]
    if path:
        with open(path, "wb") as f:
            pickle.dump([key.to_bytes() for key in made], f)
    return made


def run(identities: int, keys_path: str | None) -> dict[str, Any]:
    """The flood and the read; the figures."""
    from swarm.config import DHTTransportConfig
    from swarm.validation import index_key_of
    from testbed.dht_peers import dht_peer_factory
    from testbed.hostile_peer import HostileNode
    from testbed.netns import Hosts, in_namespace

    started = time.perf_counter()
    keys = signing_keys(identities, keys_path)
    figures: dict[str, Any] = {"identities": identities, "keys_s": round(time.perf_counter() - started, 1)}
    bounded = "dht_key_subkeys" in DHTTransportConfig.__dataclass_fields__
    figures["dht_key_subkeys"] = DHTTransportConfig().dht_key_subkeys if bounded else None
    hosts, nodes = Hosts(3), []
    hosts.create()
    try:
        with dht_peer_factory(dict(check_reachability=False, wait_timeout=1.0)) as make:
            holder = in_namespace(hosts.names[0], lambda: make(host_maddrs=[f"/ip4/{hosts.address(0)}/tcp/0"]))
            joined = holder.visible_addresses()
            reader = in_namespace(
                hosts.names[1], lambda: make(initial_peers=joined, host_maddrs=[f"/ip4/{hosts.address(1)}/tcp/0"])
            )

            def raw(i: int) -> HostileNode:
                node = in_namespace(
                    hosts.names[i], lambda: HostileNode(joined, host_maddr=f"/ip4/{hosts.address(i)}/tcp/0")
                )
                nodes.append(node)
                return node

            honest = raw(1)
            flooders = [raw(2) for _ in range(FLOODERS)]
            target, config = holder.peer.libp2p_peer_id, holder.config
            key = index_key_of(config.swarm_name, config.index_shards, 0, "honest")
            now = time.time()
            assert store_entries(honest, target, key, [index_entry(honest.signer, key, now + 300)], [now + 300])
            signers = [RSASignatureValidator(key_) for key_ in keys]
            expirations = [now + 400 + n * 1e-3 for n in range(identities)]  # each after the honest entry's
            flood = [index_entry(signer, key, when) for signer, when in zip(signers, expirations, strict=True)]
            t = time.perf_counter()
            stored = 0
            for i, flooder in enumerate(flooders):
                part = slice(i * identities // FLOODERS, (i + 1) * identities // FLOODERS)
                stored += sum(store_entries(flooder, target, key, flood[part], expirations[part]))
            figures["flood_store_s"] = round(time.perf_counter() - t, 2)
            figures["flood_stored_ok"] = stored
            held = holder.peer.node.protocol.storage.get(DHTID.generate(source=key)).value
            figures["holder_subkeys"] = len(held)
            figures["holder_keeps_honest"] = honest.marker in held.data
            t = time.perf_counter()
            found = asyncio.run_coroutine_threadsafe(reader.peer.node.get(key, latest=True), reader.peer.loop).result(
                60
            )
            figures["reader_lookup_s"] = round(time.perf_counter() - t, 3)
            figures["reader_entries"] = 0 if found is None else len(found.value)
            figures["reader_reads_honest"] = found is not None and honest.marker in found.value
            counters = holder.readout().counters
            figures["holder_counters"] = {
                name: count for name, count in counters.items() if "subkeys" in name or name.startswith("rejected/")
            }
            figures["reader_rejected"] = {
                name: count for name, count in reader.readout().counters.items() if name.startswith("rejected/")
            }
    finally:
        for node in nodes:
            node.close()
        hosts.remove()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m testbed.shard_flood", description=__doc__.splitlines()[0])
    parser.add_argument("--identities", type=int, default=4096, help="flooding identities (default 4096)")
    parser.add_argument("--keys", default=None, help="a file keeping the signing keys between runs")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.identities, args.keys), indent=1))


if __name__ == "__main__":
    main()
