"""Bounded reads (issue 61): every path that reads a peer's bytes decodes them typed, their size checked first, so a
3 MiB msgpack bomb is refused in bounded time and memory, counted by reason; the version is the exact integer; index
entries' claimed group counts are bounded as announcements' are; a map that repeats a key is refused; and a key of
another size or exponent is refused before any signature is verified. The network paths run on real DHT peers on
127.0.0.1."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import base64
import socket
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.dht.validation import DHTRecord
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey
from hivemind.utils.serializer import MSGPackSerializer

import swarm.validation
from swarm.announcements import AnnouncedRecord, decode_announcement, encode_announcement, signed_bytes
from swarm.dht_values import TypedDHTSerializer
from swarm.identity import check_key_blob, load_or_create_signing_key, public_key_of
from swarm.pubsub import publish
from swarm.records import (
    WIRE_VERSION,
    GroupRecord,
    RecordLimits,
    RecordRejected,
    decode_index_entry,
    decode_record,
    encode_record,
    group_to_wire,
)
from swarm.served import RECORD_HANDLER, PeerServedLookup
from swarm.validation import OwnerSignatureValidator, owner_marker, record_key
from testbed.bombs import (
    BOMB_BYTES,
    KINDS,
    bomb,
    decoding_paths,
    dictionary_bomb,
    measure,
    record_bomb,
    signature_openings,
    subkey_bomb,
)
from testbed.hostile_peer import HostileNode, odd_key, store_raw
from tests.swarm_fixtures import dht_peers, make_group, no_p2pd_left_behind, record_p2pd, wait_until  # noqa: F401

SECONDS = 0.5  # a generic unpack of the bomb took 1.4-10 s; a typed decode refuses it in about a millisecond
MEGABYTES = 20  # ... and about 200 MB; a typed decode at most a copy of the bytes


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def reason_of(decode: Callable[[bytes], Any], data: bytes) -> str:
    with pytest.raises(RecordRejected) as info:
        decode(data)
    return info.value.reason


class Rejections:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str, detail: str) -> None:
        self.reasons.append(reason)


class Watch:
    """The calls of one method of a victim's object, each with its CPU seconds (of the thread that ran it) and
    tracemalloc peak (MB): what the victim spends on what it is sent, whatever the network, the sender and the rest of
    the machine spend."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, obj: Any, name: str):
        self.calls: list[tuple[float, float]] = []
        original = getattr(obj, name)

        def watched(*args: Any, **kwargs: Any) -> Any:
            tracemalloc.start()
            started = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.calls.append((time.thread_time() - started, tracemalloc.get_traced_memory()[1] / 1e6))
                tracemalloc.stop()

        monkeypatch.setattr(obj, name, watched)

    def bounded(self) -> bool:
        """At least one call, and every call within :data:`SECONDS` and :data:`MEGABYTES`."""
        return bool(self.calls) and all(seconds < SECONDS and peak < MEGABYTES for seconds, peak in self.calls)


# ------------------------------------------------------------------------------------------------ every decoder


@pytest.mark.parametrize("kind", KINDS)
def test_every_decoder_of_a_peers_bytes_refuses_a_bomb_in_bounded_time_and_memory(kind):
    for path, call in decoding_paths(kind, openings_bytes=BOMB_BYTES).items():
        seconds, peak = measure(call)
        assert call() in (False, None, "RecordRejected", "ValueError"), path  # refused, never raised
        assert seconds < SECONDS and peak < MEGABYTES, (path, seconds, peak)


def test_the_dht_serializer_decodes_bytes_and_dictionaries_and_refuses_the_rest():
    rejections = Rejections()
    serializer = TypedDHTSerializer(RecordLimits().max_record_bytes, rejections)
    assert serializer.loads(MSGPackSerializer.dumps(b"value")) == b"value"
    dictionary = DictionaryDHTValue()
    dictionary.store(b"[owner:k]", b"v", time.time() + 60)
    decoded = serializer.loads(MSGPackSerializer.dumps(dictionary))
    assert isinstance(decoded, DictionaryDHTValue) and decoded.get(b"[owner:k]").value == b"v"
    for junk in (MSGPackSerializer.dumps([1]), MSGPackSerializer.dumps(("a",)), b"\xc1", dictionary_bomb()):
        with pytest.raises(RecordRejected):
            serializer.loads(junk)
    assert len(rejections.reasons) == 4


def test_the_dht_serializer_refuses_a_dictionary_larger_than_its_bound_before_any_item_is_checked():
    # A peer's typed decoding takes a dictionary of at most its own dht_key_subkeys items (the most an honest holder,
    # which trims its keys to that bound, answers with): a hostile node's answer of thousands of signed entries is
    # refused whole instead of having each entry's signature checked.
    rejections = Rejections()
    serializer = TypedDHTSerializer(RecordLimits().max_record_bytes, rejections, max_items=8)
    expires = time.time() + 60
    for items, taken in ((8, True), (9, False)):
        dictionary = DictionaryDHTValue()
        for n in range(items):
            dictionary.store(f"[owner:{n}]".encode(), b"v", expires)
        if taken:
            assert len(serializer.loads(MSGPackSerializer.dumps(dictionary)).data) == items
        else:
            with pytest.raises(RecordRejected):
                serializer.loads(MSGPackSerializer.dumps(dictionary))
    assert rejections.reasons == ["field_too_long"]


# ------------------------------------------------------------------------------------------------ the wire's rules


GOOD_RECORD = {"version": WIRE_VERSION, "created_at": 1.0, "groups": [group_to_wire(make_group("g"))]}
GOOD_ENTRY = {"version": WIRE_VERSION, "model": "m", "updated_at": 1.0, "records": [[1, 1.0, 2]]}


@pytest.mark.parametrize("version", [True, 1.0, "1", 2, None, [1]])
def test_the_version_is_the_integer_this_peer_speaks(version):
    assert decode_record(pack(GOOD_RECORD)).version == WIRE_VERSION
    assert reason_of(decode_record, pack({**GOOD_RECORD, "version": version})) == "wrong_version"
    assert reason_of(decode_index_entry, pack({**GOOD_ENTRY, "version": version})) == "wrong_version"
    key = RSAPrivateKey.process_wide()
    with pytest.raises(RecordRejected) as info:
        decode_announcement(signed_announcement(key, {**ANNOUNCED, "version": version}), "sapo")
    assert info.value.reason == "wrong_version"


@pytest.mark.parametrize("count", [-5, 0, 65, 2**62])
def test_an_index_entrys_claimed_group_count_has_the_announcements_bounds(count):
    assert [ref.num_groups for ref in decode_index_entry(pack({**GOOD_ENTRY, "records": [[1, 1.0, 64]]})).records] == [
        64
    ]
    assert reason_of(decode_index_entry, pack({**GOOD_ENTRY, "records": [[1, 1.0, count]]})) == "too_many_groups"
    key = RSAPrivateKey.process_wide()
    record = [7, 1.0, count, 100, b"d" * 32, []]
    with pytest.raises(RecordRejected) as info:
        decode_announcement(signed_announcement(key, {**ANNOUNCED, "records": [record]}), "sapo")
    assert info.value.reason == "too_many_groups"


def repeat_key(packed_map: bytes, key: str, value: Any) -> bytes:
    """``packed_map`` (a fixmap) with one more entry, ``key`` again."""
    assert 0x80 <= packed_map[0] < 0x8F
    return bytes([packed_map[0] + 1]) + packed_map[1:] + pack(key) + pack(value)


def test_a_map_that_repeats_a_key_is_refused_wherever_it_is():
    group = group_to_wire(make_group("g"))
    record = pack(GOOD_RECORD)
    assert decode_record(record).groups[0].group_id == "g"
    head = pack({**GOOD_RECORD, "groups": None})[:-1]  # the record up to its list of groups
    in_group = head + b"\x91" + repeat_key(pack(group), "model", "other")
    message = pack(group["prompt"][0])
    in_message = record.replace(message, repeat_key(message, "role", "system"))
    config = pack(group["provenance"]["config"])
    in_config = record.replace(config, repeat_key(config, "size", 11))
    metadata = pack(group["metadata"])
    in_metadata = record.replace(metadata, repeat_key(metadata, "answer", "5"))
    for data in (repeat_key(record, "created_at", 2.0), in_group, in_message, in_config, in_metadata):
        assert reason_of(decode_record, data) == "schema"
    assert reason_of(decode_index_entry, repeat_key(pack(GOOD_ENTRY), "model", "n")) == "schema"
    key = RSAPrivateKey.process_wide()
    payload = repeat_key(pack(ANNOUNCED), "model", "other")
    with pytest.raises(RecordRejected, match="repeats a key") as info:
        decode_announcement(signed_announcement(key, payload), "sapo")
    assert info.value.reason == "schema"


# ------------------------------------------------------------------------------------------------ keys

ANNOUNCED = {"version": WIRE_VERSION, "model": "tiny", "updated_at": 1.8e9, "host": None, "records": []}


def signed_announcement(key: RSAPrivateKey, payload: dict | bytes) -> bytes:
    """An announcement of ``payload`` signed by ``key`` as encode_announcement signs (any key, any payload)."""
    packed = payload if isinstance(payload, bytes) else pack(payload)
    key_blob = base64.b64decode(key.get_public_key().to_bytes()[len(b"ssh-rsa ") :])
    signature = base64.b64decode(key.sign(signed_bytes("sapo", packed)))
    return pack([packed, key_blob, signature])


@pytest.fixture(scope="module")
def odd_keys() -> dict[str, RSAPrivateKey]:
    """Keys that sign validly but are not the swarm's shape (made once: a 4096-bit key takes seconds)."""
    return {
        "4096-bit modulus": odd_key(modulus_bits=4096),
        "1024-bit modulus": odd_key(modulus_bits=1024),
        "2040-bit exponent": odd_key(exponent_bits=2040),
    }


@pytest.fixture
def verified(monkeypatch) -> list[tuple[int, int]]:
    """Every RSA signature check made in this process from now on, as (modulus bits, exponent)."""
    checks: list[tuple[int, int]] = []
    verify = RSAPublicKey.verify

    def counting(self: RSAPublicKey, data: bytes, signature: bytes) -> bool:
        numbers = self._public_key.public_numbers()
        checks.append((self._public_key.key_size, numbers.e))
        return verify(self, data, signature)

    monkeypatch.setattr(RSAPublicKey, "verify", counting)
    return checks


def test_an_announcement_with_a_key_of_another_size_or_exponent_is_refused_unverified(odd_keys, verified):
    public_key_of.cache_clear()
    for name, key in odd_keys.items():
        with pytest.raises(RecordRejected) as info:
            decode_announcement(signed_announcement(key, ANNOUNCED), "sapo")
        assert info.value.reason == "bad_key", name
    assert verified == []  # refused before any signature check
    record = AnnouncedRecord(1, 1.8e9, 2, 100, b"d" * 32)
    good = encode_announcement(RSAPrivateKey.process_wide(), "sapo", "tiny", 1.8e9, None, [record])
    verified.clear()
    assert decode_announcement(good, "sapo").records == (record,)
    assert verified == [(2048, 65537)]


def test_the_owner_check_refuses_a_key_of_another_shape_before_verifying(odd_keys, verified):
    rejections = Rejections()
    validator = OwnerSignatureValidator(RSAPrivateKey.process_wide(), rejections)
    key_id = DHTID.generate(source="sapo/records/x/1").to_bytes()
    value = MSGPackSerializer.dumps(encode_record(GroupRecord([make_group("g")], created_at=time.time())))
    for key in odd_keys.values():
        subkey = MSGPackSerializer.dumps(owner_marker(key.get_public_key().to_bytes()))
        record = DHTRecord(key_id, subkey, value, time.time() + 60)
        signed = OwnerSignatureValidator(key, lambda reason, detail: None).sign_value(record)
        assert validator.validate(DHTRecord(key_id, subkey, signed, time.time() + 60)) is False
    assert rejections.reasons == ["bad_key"] * 3 and verified == []
    for blob in (b"", b"\x00" * 279, b"x" * 10_000):
        with pytest.raises(RecordRejected):
            check_key_blob(blob)


def test_a_signing_key_file_of_another_shape_is_refused_with_a_clear_error(tmp_path, odd_keys):
    from cryptography.hazmat.primitives import serialization

    path = tmp_path / "odd.pem"
    private = odd_keys["1024-bit modulus"]._private_key
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pem)
    with pytest.raises(ValueError, match="not an RSA-2048 key with exponent 65537.*move it away"):
        load_or_create_signing_key(str(path))
    fresh = load_or_create_signing_key(str(tmp_path / "new.pem"))
    assert load_or_create_signing_key(str(tmp_path / "new.pem")).get_public_key().to_bytes() == (
        fresh.get_public_key().to_bytes()
    )


# ------------------------------------------------------------------------------------------------ real peers


def on_loop(peer: Any, coroutine: Any, timeout: float = 30) -> Any:
    """Run ``coroutine`` on a DHTTransport's event loop (where its DHT node and p2p live)."""
    return asyncio.run_coroutine_threadsafe(coroutine, peer.peer.loop).result(timeout)


pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")


def test_bombs_stored_at_a_peer_are_refused_cheaply_and_counted(dht_peers, monkeypatch):
    victim = dht_peers(wait_timeout=10.0)  # 3 MiB sent on a loaded machine: more than the fast tests' second
    hostile = HostileNode(victim.visible_addresses(), on_p2pd=record_p2pd)
    try:
        protocol = victim.peer.node.protocol
        assert isinstance(protocol.serializer, TypedDHTSerializer)
        key, expiration = record_key("sapo", "hostile", 1), time.time() + 60
        key_id = DHTID.generate(source=key).to_bytes()
        dumps = MSGPackSerializer.dumps
        value = hostile.signed(key, hostile.marker, dumps(record_bomb()), expiration)  # a valid signature
        subkey = subkey_bomb(hostile.key.get_public_key().to_bytes())  # the marker inside, then a bomb
        good = dumps(encode_record(GroupRecord([make_group("g")], created_at=time.time())))
        signed_with_bomb_subkey = hostile.signer.sign_value(DHTRecord(key_id, subkey, good, expiration))
        forged = dumps(record_bomb()) + b"[signature:" + base64.b64encode(b"s" * 256) + b"]"
        attacks = {  # what the victim's validator reads; what hivemind unpacks after it; what it unpacks before it
            "record value": (dumps(hostile.marker), value, "validate", "too_many_groups"),
            "subkey": (subkey, signed_with_bomb_subkey, "validate", "bad_signature"),
            "dictionary": (b"", dictionary_bomb(), "loads", "field_too_long"),
            # hivemind's signature regex is quadratic on these (40 KB: seconds), and it formats a forged value into a
            # log message it drops: both are the owner check's, linear, now
            "signature openings": (dumps(hostile.marker), signature_openings(), "validate", "bad_signature"),
            "forged signature": (dumps(hostile.marker), forged, "validate", "bad_signature"),
        }
        for name, (tag, sent, method, reason) in attacks.items():
            watch = Watch(
                monkeypatch, protocol.record_validator if method == "validate" else protocol.serializer, method
            )
            before = victim.readout().counters.get(f"rejected/{reason}", 0)
            try:
                outcome = store_raw(hostile, victim.peer.libp2p_peer_id, key, tag, sent, expiration)
            except Exception as e:  # the victim's handler raised: hivemind answers the store with an error
                outcome = e
            assert outcome == [False] or isinstance(outcome, Exception), (name, outcome)
            assert victim.readout().counters.get(f"rejected/{reason}", 0) == before + 1, name
            assert watch.bounded(), (name, watch.calls)
            monkeypatch.undo()
        honest = hostile.signed(key, hostile.marker, good, expiration)
        assert store_raw(hostile, victim.peer.libp2p_peer_id, key, dumps(hostile.marker), honest, expiration) == [True]
        assert victim.healthy()
    finally:
        hostile.close()


def test_a_bomb_in_a_lookups_answer_is_refused_cheaply_and_counted(dht_peers, monkeypatch):
    victim = dht_peers(wait_timeout=10.0)
    hostile = HostileNode(victim.visible_addresses(), on_p2pd=record_p2pd)
    try:
        key_id = DHTID.generate(source="asked/by/this/test/only")  # no background read of the victim asks for it
        hostile.node.protocol.storage.store_subkey(key_id, hostile.marker, b"x", time.time() + 60)

        class Bombing:  # the hostile node answers a lookup of a dictionary with a bomb
            loads = staticmethod(MSGPackSerializer.loads)

            @staticmethod
            def dumps(obj: Any) -> bytes:
                return dictionary_bomb() if isinstance(obj, DictionaryDHTValue) else MSGPackSerializer.dumps(obj)

        hostile.node.protocol.serializer = Bombing
        watch = Watch(monkeypatch, victim.peer.node.protocol.serializer, "loads")
        before = victim.readout().counters.get("rejected/field_too_long", 0)
        find = victim.peer.node.protocol.call_find
        assert on_loop(victim, find(hostile.node.peer_id, [key_id])) is None  # the whole answer is dropped
        assert victim.readout().counters["rejected/field_too_long"] == before + 1
        assert watch.bounded(), watch.calls
    finally:
        hostile.close()


def test_a_served_records_envelope_and_signature_are_checked_before_its_body(dht_peers, monkeypatch):
    victim = dht_peers()
    hostile = HostileNode(victim.visible_addresses(), on_p2pd=record_p2pd)
    try:
        key, expiration = record_key("sapo", "hostile", 1), time.time() + 60
        dumps = MSGPackSerializer.dumps
        body = dumps(record_bomb())
        answers = {
            "envelope": bomb(),
            "forged": pack([body + b"[signature:" + base64.b64encode(b"s" * 256) + b"]", expiration]),
            "signed": pack([hostile.signed(key, hostile.marker, body, expiration), expiration]),
        }
        answer: list[bytes] = []

        async def serve(request: BytesValue, context: Any = None) -> BytesValue:
            return BytesValue(value=answer[-1])

        hostile.run(hostile.node.p2p.add_protobuf_handler(RECORD_HANDLER, serve, BytesValue))
        validator = victim.peer._validator
        lookup = PeerServedLookup(lambda: victim.peer.p2p.call_protobuf_handler, validator, 3 * 2**20 + 4096)
        decoded: list[int] = []
        decode = swarm.validation.decode_record
        monkeypatch.setattr(swarm.validation, "decode_record", lambda *a: decoded.append(1) or decode(*a))
        answer_watch = Watch(monkeypatch, swarm.served, "decode_answer")
        open_watch = Watch(monkeypatch, validator, "validate")
        host = hostile.node.peer_id.to_base58()

        async def fetch() -> bytes | None:
            try:
                record = await lookup.get_served(host, key)
            except RecordRejected as e:  # the fetcher counts it under its reason
                return e.reason
            return lookup.open(key, hostile.marker, record)

        outcomes = {}
        for name, sent in answers.items():
            answer.append(sent)
            decoded.clear()
            before = victim.readout().counters
            outcome = on_loop(victim, fetch())
            after = victim.readout().counters
            reasons = {n for n in after if n.startswith("rejected/") and after[n] > before.get(n, 0)}
            outcomes[name] = (outcome, reasons, len(decoded))
        assert outcomes["envelope"] == ("schema", set(), 0)  # refused before any check of what it holds
        assert outcomes["forged"] == (None, {"rejected/bad_signature"}, 0)  # its body never decoded
        assert outcomes["signed"] == (None, {"rejected/too_many_groups"}, 1)  # decoded typed, once its signature held
        assert answer_watch.bounded() and open_watch.bounded(), (answer_watch.calls, open_watch.calls)
    finally:
        hostile.close()


def test_a_key_of_another_shape_is_refused_unverified_by_a_real_peer(dht_peers, odd_keys, verified):
    victim = dht_peers()
    for name, key in odd_keys.items():
        hostile = HostileNode(victim.visible_addresses(), on_p2pd=record_p2pd, key=key)
        try:
            storage_key, expiration = record_key("sapo", "hostile", 1), time.time() + 60
            good = MSGPackSerializer.dumps(encode_record(GroupRecord([make_group("g")], created_at=time.time())))
            before = victim.readout().counters.get("rejected/bad_key", 0)
            value = hostile.signed(storage_key, hostile.marker, good, expiration)  # a valid signature
            assert hostile.store_at(victim, storage_key, hostile.marker, value, expiration) is False, name
            assert victim.readout().counters["rejected/bad_key"] == before + 1, name
        finally:
            hostile.close()
    assert all(check == (2048, 65537) for check in verified), set(verified)  # honest traffic only


def test_bombs_and_odd_keys_announced_on_a_topic_are_refused_and_counted(dht_peers, odd_keys, verified):
    victim = dht_peers()
    sender = dht_peers(initial_peers=victim.visible_addresses())
    wait_until(lambda: victim.gossip.topics() and sender.gossip.topics(), 20)
    announcements = {  # what is published, the reason the victim counts
        "bomb of 60 KB": (bomb(size=60_000), "too_large"),
        "payload bomb, signed": (signed_announcement(RSAPrivateKey.process_wide(), record_bomb(size=1200)), "schema"),
        "version true, signed": (
            signed_announcement(RSAPrivateKey.process_wide(), {**ANNOUNCED, "version": True}),
            "wrong_version",
        ),
        "2040-bit exponent": (signed_announcement(odd_keys["2040-bit exponent"], ANNOUNCED), "bad_key"),
    }
    for name, (data, reason) in announcements.items():
        counter = f"rejected/{reason}"
        before = victim.readout().counters.get(counter, 0)

        def arrived(data: bytes = data, counter: str = counter, before: int = before) -> bool:
            for topic in victim.gossip.topics():
                on_loop(sender, publish(sender.peer.p2p, topic, data))
            return victim.readout().counters.get(counter, 0) > before

        wait_until(arrived, 30, interval=1.0, message=name)
    assert all(e == 65537 for _, e in verified), set(verified)  # the odd key was never verified


def test_dial_backs_are_bounded_for_all_askers_together_not_only_per_asker():
    """Each dial-back request makes this peer look up the asker and open a TCP connection to it; identities cost
    nothing, so fresh askers would make it dial without end. Within a minute it answers each asker once and 30 askers
    in all; the others get no answer and no dial (`swarm/dial_backs_refused`)."""
    from types import SimpleNamespace

    from swarm.reachability import DialBack, decode_verdict, encode_ports
    from swarm.transport import SwarmCounters

    looked_up = []

    class Daemon:
        async def list_peers(self):
            looked_up.append(1)
            return [SimpleNamespace(peer_id=asker, addrs=[{"ip4": "127.0.0.1"}])]

    async def unreachable(count: int) -> None:
        raise AssertionError("this peer's own check is not run here")

    counters = SwarmCounters()
    dial_back = DialBack(Daemon, lambda: [], lambda: [], 0.2, counters, unreachable)
    with socket.socket() as closed:  # a port of 127.0.0.1 nobody listens on: each dial is refused at once
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    request = BytesValue(value=encode_ports([port]))
    answers = []
    for n in range(40):
        asker = SimpleNamespace(to_base58=lambda n=n: f"fresh-identity-{n}")
        answers.append(asyncio.run(dial_back.handle(request, SimpleNamespace(remote_id=asker))))
        if n == 0:  # the same asker again at once: no second dial
            assert asyncio.run(dial_back.handle(request, SimpleNamespace(remote_id=asker))).value == b""
    assert all(isinstance(decode_verdict(a.value), bool) for a in answers[:30])  # answered: the dial was made
    assert all(a.value == b"" for a in answers[30:]) and len(looked_up) == 30
    assert counters.snapshot()["dial_backs_answered"] == 30 and counters.snapshot()["dial_backs_refused"] == 11


def test_a_dial_back_never_dials_a_relay_that_an_asker_came_through(monkeypatch):
    """A peer reached through a circuit relay is listed at the relay's address: dialing the ports the asker names
    there would make this peer probe a third party. Only an address of the asker's own is dialed; with none, no
    answer and no dial. (Dials are recorded, never made: the addresses are documentation ones.)"""
    from types import SimpleNamespace

    from hivemind.utils.multiaddr import Multiaddr

    from swarm import reachability
    from swarm.reachability import DialBack, encode_ports, observed_ip
    from swarm.transport import SwarmCounters

    dialed = []

    async def record_dial(ip, ports, timeout):
        dialed.append(ip)
        return False

    monkeypatch.setattr(reachability, "can_connect", record_dial)

    relayed = Multiaddr("/ip4/203.0.113.9/tcp/4001/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N/p2p-circuit")
    direct = Multiaddr("/ip4/198.51.100.4/tcp/31337")
    assert observed_ip([relayed, direct]) == "203.0.113.9"  # a store's host: the relay's, as documented
    assert observed_ip([relayed, direct], direct_only=True) == "198.51.100.4"
    asker = SimpleNamespace(to_base58=lambda: "relayed-asker")

    class Daemon:
        async def list_peers(self):
            return [SimpleNamespace(peer_id=asker, addrs=[relayed])]

    async def unreachable(count: int) -> None:
        raise AssertionError("this peer's own check is not run here")

    counters = SwarmCounters()
    dial_back = DialBack(Daemon, lambda: [], lambda: [], 0.2, counters, unreachable)
    answer = asyncio.run(dial_back.handle(BytesValue(value=encode_ports([4001])), SimpleNamespace(remote_id=asker)))
    assert answer.value == b"" and dialed == [] and "dial_backs_answered" not in counters.snapshot()
