"""msgpack bombs: a few MiB that a generic unpacker turns into millions of Python objects (seconds of garbage
collection, hundreds of MB), shaped for each path that reads a peer's bytes; and what each path spends on one. And
find bombs: small DHT find requests that name one large stored value many times, or very many keys, which hivemind's
own find handler answers in full (hundreds of MiB, seconds of CPU). And ping floods: pings of ~60 bytes, each claiming a
fresh node id, each of which made hivemind loop over every key its DHT storage holds.

``python -m testbed.bombs`` prints, per path, the CPU seconds and the tracemalloc peak one bomb costs the decoder (or
the find handler) this checkout has (run it with ``PYTHONPATH`` at another checkout to measure that one's).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import time
import tracemalloc
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import msgpack

BOMB_BYTES = 3 * 2**20 - 4096
"""A bomb's size: under the default ``max_record_bytes`` (3 MiB), with room for the envelope around it."""

KINDS = ("arrays", "maps", "nested")
"""``arrays``: one array of empty arrays (the costliest for msgpack's unpacker); ``maps``: one array of empty maps;
``nested``: maps nested as deep as the bytes allow."""


def bomb(kind: str = "arrays", size: int = BOMB_BYTES) -> bytes:
    """One msgpack value of ``size`` bytes of ``kind`` (:data:`KINDS`)."""
    if kind == "nested":
        return b"\x81\xa0" * ((size - 1) // 2) + b"\xc0"  # {"": {"": ... nil}}
    if kind not in KINDS:
        raise ValueError(f"bomb kind {kind!r} is not one of {KINDS}")
    count = size - 5
    return b"\xdd" + count.to_bytes(4, "big") + (b"\x90" if kind == "arrays" else b"\x80") * count


def inside(fields: dict[str, Any], key: str, kind: str = "arrays", size: int = BOMB_BYTES) -> bytes:
    """The map ``fields`` packed with a bomb as the value of ``key``, ``size`` bytes in all: what a decoder reads
    as a record, an index entry or an announcement's payload."""
    head = msgpack.packb({**fields, key: None}, use_bin_type=True)[:-1]  # the map up to the value of `key`
    return head + bomb(kind, size - len(head))


def record_bomb(kind: str = "arrays", size: int = BOMB_BYTES) -> bytes:
    """A record whose ``groups`` is a bomb."""
    return inside({"version": 1, "created_at": 1.0}, "groups", kind, size)


def index_bomb(kind: str = "arrays", size: int = BOMB_BYTES) -> bytes:
    """An index entry whose ``records`` is a bomb."""
    return inside({"version": 1, "model": "m", "updated_at": 1.0}, "records", kind, size)


def dictionary_bomb(kind: str = "arrays", size: int = BOMB_BYTES) -> bytes:
    """A DHT dictionary value (hivemind's ext type 0x50) whose items are a bomb."""
    body = b"\x93\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00\xcb" + b"\x00" * 8  # [inf, 0.0, <items>]
    items = bomb(kind, size - len(body) - 6)
    return b"\xc9" + (len(body) + len(items)).to_bytes(4, "big") + b"\x50" + body + items


def subkey_bomb(public_key: bytes, kind: str = "arrays", size: int = BOMB_BYTES) -> bytes:
    """A serialized DHT subkey: an array holding a real owner marker of ``public_key``, then a bomb."""
    marker = msgpack.packb(b"[owner:" + public_key + b"]", use_bin_type=True)
    rest = bomb(kind, size - len(marker) - 5)
    return b"\xdd" + (2).to_bytes(4, "big") + marker + rest


# ------------------------------------------------------------------------------------------------
# the measurement


def signature_openings(size: int = BOMB_BYTES) -> bytes:
    """A DHT value of ``size`` bytes of repeated ``[signature:`` openings: hivemind's signature regex takes time
    quadratic in their count (40 KB: seconds)."""
    return b"[signature:" * (size // 11)


def decoding_paths(kind: str, openings_bytes: int = 40_000) -> dict[str, Callable[[], Any]]:
    """Each path that reads a peer's bytes, fed a bomb of ``kind``, as the decoders of this checkout run it;
    ``openings_bytes``: the size of the value of :func:`signature_openings` (small enough for a quadratic check)."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils.crypto import RSAPrivateKey
    from hivemind.utils.serializer import MSGPackSerializer

    from sapo.node.peer_probe import announced_entry
    from swarm.announcements import decode_announcement, signed_bytes
    from swarm.membership import MembershipValidator
    from swarm.reachability import decode_ports
    from swarm.records import RecordLimits, decode_index_entry, decode_record
    from swarm.served import decode_answer
    from swarm.validation import OwnerSignatureValidator, SwarmSchemaValidator, owner_marker

    try:  # this checkout's DHT serializer: the typed one where there is one, else hivemind's
        from swarm.dht_values import TypedDHTSerializer

        serializer: Any = TypedDHTSerializer(RecordLimits().max_record_bytes, lambda reason, detail: None)
    except ImportError:
        serializer = MSGPackSerializer

    def ignore(reason: str, detail: str) -> None:
        pass

    key = RSAPrivateKey()
    record_id = DHTID.generate(source="sapo/records/x/1").to_bytes()
    schema = SwarmSchemaValidator("sapo", 8, RecordLimits(), ignore, index_max_level=10)
    members = MembershipValidator(lambda peer: True, ignore)
    record, index, raw = record_bomb(kind), index_bomb(kind), bomb(kind)
    owner = OwnerSignatureValidator(key, ignore)
    marker = MSGPackSerializer.dumps(owner_marker(key.get_public_key().to_bytes()))
    openings = DHTRecord(record_id, marker, signature_openings(openings_bytes), 1e12)
    forged = DHTRecord(record_id, marker, MSGPackSerializer.dumps(record) + b"[signature:" + b"A" * 344 + b"]", 1e12)
    stored = DHTRecord(record_id, MSGPackSerializer.dumps(b"s"), MSGPackSerializer.dumps(record), 1e12)
    subkey = subkey_bomb(key.get_public_key().to_bytes(), kind)
    with_subkey = DHTRecord(record_id, subkey, b"v", 1e12)
    dictionary = dictionary_bomb(kind)
    payload = inside({"version": 1}, "model", kind, 1200)  # signed: the payload is read once the signature passed
    key_blob = base64.b64decode(key.get_public_key().to_bytes()[len(b"ssh-rsa ") :])
    signature = base64.b64decode(key.sign(signed_bytes("sapo", payload)))
    announcement = msgpack.packb([payload, key_blob, signature], use_bin_type=True)

    def refused(call: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            try:
                return call()
            except Exception as e:  # a refusal is the expected outcome; its cost is what is measured
                return type(e).__name__

        return run

    return {
        "record (decode_record)": refused(lambda: decode_record(record)),
        "index entry (decode_index_entry)": refused(lambda: decode_index_entry(index)),
        "DHT store value (schema validator)": refused(lambda: schema.validate(stored)),
        f"DHT value of {openings_bytes // 1000} KB of '[signature:' (owner validator)": refused(
            lambda: owner.validate(openings)
        ),
        "DHT store value, forged signature (owner validator)": refused(lambda: owner.validate(forged)),
        "DHT subkey (membership validator)": refused(lambda: members.validate(with_subkey)),
        "DHT subkey (hivemind's serializer)": refused(lambda: serializer.loads(subkey)),
        "DHT dictionary (hivemind's serializer)": refused(lambda: serializer.loads(dictionary)),
        "served answer (decode_answer)": refused(lambda: decode_answer(raw, 2**30)),
        "announcement of 3 MiB": refused(lambda: decode_announcement(raw, "sapo")),
        "announcement payload of 1.2 KB, signed": refused(lambda: decode_announcement(announcement, "sapo")),
        "dial-back request (decode_ports)": refused(lambda: decode_ports(raw)),
        "doctor's index read (announced_entry)": refused(lambda: announced_entry(index)),
    }


FIND_VALUE_BYTES = 3_000_000
"""The value a find bomb names: a record of 2.86 MiB, within ``max_record_bytes`` (any peer may store one)."""


def find_protocol(value_bytes: int = FIND_VALUE_BYTES, neighbours: int = 64) -> tuple[Any, Any]:
    """A DHT node's protocol without a network (hivemind's ``DHTProtocol``, its storage holding one value of
    ``value_bytes`` bytes, its routing table ``neighbours`` made-up peers): ``(protocol, the value's DHTID)``."""
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import DHTID, RoutingTable
    from hivemind.dht.storage import DHTLocalStorage
    from hivemind.p2p import PeerID
    from hivemind.proto import dht_pb2
    from hivemind.utils import get_dht_time
    from hivemind.utils.serializer import MSGPackSerializer

    protocol = DHTProtocol.__new__(DHTProtocol)  # no p2p: only what a find reads
    protocol.node_id = DHTID.generate()
    protocol.bucket_size = 20
    protocol.storage, protocol.cache = DHTLocalStorage(), DHTLocalStorage(maxsize=1000)
    protocol.routing_table = RoutingTable(protocol.node_id, 20, 5)
    protocol.node_info = dht_pb2.NodeInfo(node_id=protocol.node_id.to_bytes())
    protocol.serializer = MSGPackSerializer
    for n in range(neighbours):
        protocol.routing_table.add_or_update_node(DHTID.generate(), PeerID(b"\x00\x24" + bytes([n]) * 36))
    key = DHTID.generate(source="sapo/records/attacker/1")
    protocol.storage.store(key, b"x" * value_bytes, get_dht_time() + 600)
    return protocol, key


def find_handler(protocol: Any) -> Callable[[Any, Any], Any]:
    """The find handler this checkout gives ``protocol``: the gated one (a fresh :class:`swarm.find_gate.FindGate`)
    where there is one, else hivemind's ``rpc_find``."""
    try:
        from swarm.find_gate import FindGate
        from swarm.hivemind_bridge import gated_find
        from swarm.transport import SwarmCounters
    except ImportError:
        return protocol.rpc_find
    return gated_find(protocol, FindGate(SwarmCounters()).wrap)


def find_paths(repeats: int = 64, small_keys: int = 20_000) -> dict[str, Callable[[], Any]]:
    """Find requests against :func:`find_protocol`'s node, each answered by this checkout's handler
    (:func:`find_handler`) and serialized as the transport would: one naming the stored value ``repeats`` times, one
    naming ``small_keys`` keys of nothing. Each call returns None (the answer's size: :func:`find_answer_bytes`)."""
    from hivemind.dht.routing import DHTID
    from hivemind.proto import dht_pb2

    protocol, key = find_protocol()
    repeated = dht_pb2.FindRequest(keys=[key.to_bytes()] * repeats)
    many = dht_pb2.FindRequest(keys=[DHTID.generate().to_bytes() for _ in range(small_keys)])

    def find(request: Any) -> Callable[[], None]:
        def run() -> None:
            find_answer_bytes(protocol, request)

        return run

    value_mib = FIND_VALUE_BYTES / 2**20
    return {
        f"DHT find naming a {value_mib:.2f} MiB value {repeats} times": find(repeated),
        f"DHT find naming {small_keys} keys": find(many),
    }


def find_answer_bytes(protocol: Any, request: Any) -> int:
    """The bytes of the answer this checkout's find handler gives ``request`` at ``protocol``, serialized."""
    context = SimpleNamespace(remote_id=SimpleNamespace(to_base58=lambda: "asker"))
    return len(asyncio.run(find_handler(protocol)(request, context)).SerializeToString())


PING_STORED_KEYS = 16_384
"""The keys a ping flood's victim holds: ``dht_storage_values``, the most the swarm's DHT storage keeps."""


def ping_protocol(keys: int = PING_STORED_KEYS, neighbours: int = 50) -> Any:
    """:func:`find_protocol`'s node holding ``keys`` small values, with ``neighbours`` made-up peers; what it would
    send (a copy of values to a newcomer, a ping of a neighbour) goes nowhere."""
    from hivemind.dht.routing import DHTID
    from hivemind.utils import get_dht_time

    protocol, _ = find_protocol(value_bytes=100, neighbours=neighbours)
    protocol.num_replicas = 5
    for _ in range(keys - 1):
        protocol.storage.store(DHTID.generate(), b"x" * 100, get_dht_time() + 600)

    async def sent_nowhere(*args: Any, **kwargs: Any) -> None:
        return None

    protocol.call_store = protocol.call_ping = sent_nowhere
    return protocol


def ping_handler(protocol: Any) -> Callable[[Any, Any], Any]:
    """The ping handler this checkout gives ``protocol``: the gated one (a fresh :class:`swarm.ping_gate.PingGate`,
    the routing updates bounded by a fresh :class:`swarm.ping_gate.RoutingGuard`) where there is one, else hivemind's
    ``rpc_ping``."""
    from hivemind.proto import dht_pb2

    try:
        from swarm.hivemind_bridge import bound_routing_updates
        from swarm.ping_gate import PingGate, RoutingGuard
        from swarm.transport import SwarmCounters
    except ImportError:
        return protocol.rpc_ping
    bound_routing_updates(SimpleNamespace(protocol=protocol), RoutingGuard())
    return PingGate(SwarmCounters()).wrap(protocol.rpc_ping, lambda request: dht_pb2.PingResponse())


def ping_paths(pings: int = 20) -> dict[str, Callable[[], Any]]:
    """``pings`` pings from one libp2p peer, each claiming a fresh node id, against :func:`ping_protocol`'s node
    answered by this checkout's handler (:func:`ping_handler`), and the routing-table updates they start run."""
    from hivemind.dht.routing import DHTID
    from hivemind.p2p import PeerID
    from hivemind.proto import dht_pb2

    protocol = ping_protocol()
    sender = PeerID(b"\x00\x24" + b"\xee" * 36)
    context = SimpleNamespace(remote_id=sender)

    async def flood() -> None:
        handler = ping_handler(protocol)
        for _ in range(pings):
            peer = dht_pb2.NodeInfo(node_id=DHTID.generate().to_bytes())
            await handler(dht_pb2.PingRequest(peer=peer), context)
            while pending := [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]:
                await asyncio.gather(*pending)

    return {
        f"DHT pings claiming {pings} fresh node ids ({PING_STORED_KEYS} keys held)": lambda: asyncio.run(flood()),
    }


def measure(call: Callable[[], Any]) -> tuple[float, float]:
    """(CPU seconds of the calling thread, tracemalloc peak in MB) of one ``call``: timed untraced, then traced for its
    peak. The thread's CPU is what the decode spends, whatever else the machine runs (wall time is not)."""
    started = time.thread_time()
    call()
    seconds = time.thread_time() - started
    tracemalloc.start()
    try:
        call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return seconds, peak / 1e6


def main(argv: list[str] | None = None) -> None:
    """Print the cost of one bomb per path (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m testbed.bombs", description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=KINDS, default="arrays")
    parser.add_argument("--openings-bytes", type=int, default=40_000, help="see decoding_paths")
    parser.add_argument("--only", default="", help="measure the paths whose name contains this text only")
    args = parser.parse_args(argv)
    for name, call in {**decoding_paths(args.kind, args.openings_bytes), **find_paths(), **ping_paths()}.items():
        if args.only not in name:
            continue
        seconds, peak = measure(call)
        print(f"{name:56s} {seconds * 1e3:10.2f} ms {peak:8.2f} MB", flush=True)


if __name__ == "__main__":
    main()
