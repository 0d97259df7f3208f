"""A hostile DHT node that keeps a reader's lookup asking it: every find it answers holds a dictionary of signed index
entries dated too old to end the lookup, and neighbours with made-up node ids nearer the key than any before, all
mapped to its own libp2p peer id. The test (tests/test_swarm_lookup_guard.py) and the measurement share it:

    python -m testbed.lookup_attack [--entries 256] [--seconds 20]

runs a reader (a DHTTransport peer on 127.0.0.1) and such a hostile node, looks one index shard up as an index read
does, and prints how many times the hostile node was asked within the lookup and the CPU seconds of the reader's
event-loop thread meanwhile. Only 127.0.0.1 is used; both peers are stopped at the end."""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.dht.validation import DHTRecord
from hivemind.proto import dht_pb2
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.serializer import MSGPackSerializer

from swarm.hivemind_bridge import gate_find_handler
from swarm.records import IndexEntry, RecordRef, encode_index_entry
from swarm.validation import index_keys
from testbed.hostile_peer import HostileNode


def signed_index_dictionary(key: str, entries: int, expiration: float) -> bytes:
    """A serialized dictionary of ``entries`` index entries under DHT key ``key``, each signed by a key of its own (as
    an honest shard holds them), all expiring at ``expiration``."""
    key_id = DHTID.generate(source=key).to_bytes()
    dictionary = DictionaryDHTValue()
    now = time.time()
    for n in range(entries):
        signer = RSASignatureValidator(RSAPrivateKey())
        subkey = signer.local_public_key  # its owner marker: only this key may sign under it
        refs = [RecordRef(seq, now - seq, 8) for seq in range(8)]
        value = MSGPackSerializer.dumps(encode_index_entry(IndexEntry(f"model-{n}", refs, now)))
        record = DHTRecord(key_id, MSGPackSerializer.dumps(subkey), value, expiration)
        dictionary.store(subkey, signer.sign_value(record), expiration)
    return MSGPackSerializer.dumps(dictionary)


class EndlessNeighbours:
    """The hostile node's find handler: for ``key`` a dictionary (``value``, dated ``expiration``) and ``neighbours``
    made-up node ids, each nearer the key than any named before, all mapped to ``peer_id`` (its own by default); other
    keys: not found, no neighbours. Counts the requests naming ``key`` (``asked``)."""

    def __init__(self, key: str, value: bytes, expiration: float, peer_id: bytes, neighbours: int = 8):
        self.key_id = DHTID.generate(source=key)
        self.value, self.expiration, self.peer_id, self.neighbours = value, expiration, peer_id, neighbours
        self.distance = 2**159  # the next made-up id lies this far from the key, and each one after nearer
        self.asked = 0
        self.node_info: Any = None

    async def __call__(self, request: Any, context: Any) -> Any:
        response = dht_pb2.FindResponse(results=[], peer=self.node_info)
        for raw in request.keys:
            if raw != self.key_id.to_bytes():
                response.results.append(dht_pb2.FindResult(type=dht_pb2.NOT_FOUND))
                continue
            self.asked += 1
            result = dht_pb2.FindResult(
                type=dht_pb2.FOUND_DICTIONARY, value=self.value, expiration_time=self.expiration
            )
            for _ in range(self.neighbours):
                self.distance -= 1
                result.nearest_node_ids.append(DHTID(int(self.key_id) ^ self.distance).to_bytes())
                result.nearest_peer_ids.append(self.peer_id)
            response.results.append(result)
        return response


def install(hostile: HostileNode, handler: EndlessNeighbours) -> None:
    """Answer ``hostile``'s find requests with ``handler``."""
    handler.node_info = hostile.node.protocol.node_info
    hostile.run(gate_find_handler(hostile.node, lambda answer, refuse: handler))


def thread_cpu(native_id: int) -> float:
    """CPU seconds (user + system) of the thread ``native_id`` of this process."""
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lookup(reader: Any, key: str, timeout: float) -> tuple[Any, float, float]:
    """Look ``key`` up at ``reader`` (a DHTTransport) as an index read does (a copy updated within index_staleness
    wanted, ``dht_lookup_beam``, ended by ``timeout``): (what it found or None, seconds, CPU seconds of the reader's
    event-loop thread)."""
    config, node = reader.config, reader.peer.node
    sufficient = time.time() + config.record_ttl - config.index_staleness

    async def get() -> Any:
        try:
            found = await asyncio.wait_for(
                node.get_many([key], sufficient_expiration_time=sufficient, beam_size=config.dht_lookup_beam), timeout
            )
            return found[key]
        except TimeoutError:
            return None

    cpu, started = thread_cpu(reader.peer.thread_id), time.monotonic()
    found = asyncio.run_coroutine_threadsafe(get(), reader.peer.loop).result(timeout + 10)
    return found, time.monotonic() - started, thread_cpu(reader.peer.thread_id) - cpu


def attack(
    make_reader: Callable[..., Any], entries: int, seconds: float, on_p2pd: Callable[..., None] | None = None
) -> dict[str, float]:
    """A reader from ``make_reader(**config)``, a hostile node joined through it answering an index shard's lookups
    endlessly with ``entries`` signed entries, one lookup of that shard of at most ``seconds``: how many times the
    hostile node was asked, the lookup's seconds and the reader's event-loop CPU seconds. The hostile node is stopped
    here; the reader is the caller's to stop."""
    reader = make_reader(fetch_timeout=seconds)
    config = reader.config  # a shard of the index's top level: the reader (alone) writes its own entry lower down
    key = index_keys(config.swarm_name, config.index_shards, config.index_max_level)[0]
    expiration = time.time() + 60  # valid, but older than the copy an index read wants: the lookup goes on
    value = signed_index_dictionary(key, entries, expiration)
    hostile = HostileNode(reader.visible_addresses(), on_p2pd=on_p2pd)
    try:
        handler = EndlessNeighbours(key, value, expiration, hostile.node.p2p.peer_id.to_bytes())
        install(hostile, handler)
        found, took, cpu = lookup(reader, key, seconds)
        time.sleep(0.5)  # finds still in flight when the lookup ended
        return {
            "asked": handler.asked,
            "seconds": round(took, 2),
            "loop_cpu_seconds": round(cpu, 2),
            "entries_found": len(found.value) if found is not None else 0,
        }
    finally:
        hostile.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=256, help="signed index entries in each hostile answer")
    parser.add_argument("--seconds", type=float, default=20.0, help="the lookup's timeout (fetch_timeout)")
    args = parser.parse_args(argv)
    from testbed.dht_peers import dht_peer_factory

    fast = dict(wait_timeout=1.0, join_timeout=20.0, poll_interval=0.1, index_refresh_interval=1.0)
    with dht_peer_factory(fast) as make:
        result = attack(make, args.entries, args.seconds)
    print(result, f"(threads alive: {threading.active_count()})")


if __name__ == "__main__":
    main()
