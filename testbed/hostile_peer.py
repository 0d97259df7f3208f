"""A hostile swarm for fault tests and benchmarks: poisoned groups, wire-level attacks, and a raw hivemind DHTNode
that signs what it likes and sends it anywhere, against an honest SAPOTrainer (tests/test_hostile.py,
benchmarks/reliability.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.serializer import MSGPackSerializer

from sapo.tasks import TaskSpec
from swarm.config import nat_options
from swarm.daemon import close_p2p, close_stopped_loop
from swarm.hivemind_bridge import daemon_process, signing_key
from swarm.records import WIRE_VERSION, Group, Provenance, group_to_wire
from swarm.validation import record_key

LOCAL = "/ip4/127.0.0.1/tcp/0"
TASKS = [TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})]


class HostileNode:
    """A raw hivemind DHTNode with its own RSA key and no validator, on its own event loop thread."""

    def __init__(
        self,
        initial_peers: list[str],
        on_p2pd: Callable[[int, list[str]], None] | None = None,
        nearest_to: str | None = None,
        key: RSAPrivateKey | None = None,
        host_maddr: str = LOCAL,
    ):
        """Join through ``initial_peers``; ``on_p2pd(pid, sockets)`` is told of the p2pd daemon it starts (a test
        uses it to check that the daemon is gone at the end). With ``nearest_to``, the node's DHT id is that key's, so
        every lookup of the key asks this node first. ``key``: what it signs with (default: a fresh swarm key).
        ``host_maddr``: where it listens (default: 127.0.0.1, any port)."""
        self.key = key or RSAPrivateKey()
        self.signer = RSASignatureValidator(self.key)
        self.marker = self.signer.local_public_key
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        node_id = DHTID.generate(source=nearest_to) if nearest_to is not None else None
        self.node: DHTNode = self.run(
            DHTNode.create(
                node_id=node_id,
                initial_peers=initial_peers,
                host_maddrs=[host_maddr],
                wait_timeout=1,
                **nat_options([host_maddr]),
            )
        )
        if on_p2pd is not None:
            on_p2pd(daemon_process(self.node.p2p).pid, [self.node.p2p.daemon_listen_maddr["unix"]])

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def visible_addresses(self) -> list[str]:
        """Multiaddrs other peers can join through (as :meth:`swarm.dht.DHTTransport.visible_addresses`)."""
        return [str(address) for address in self.run(self.node.get_visible_maddrs())]

    def signed(self, key: str, subkey: bytes, value: bytes, expiration: float, forge: bool = False) -> bytes:
        """``value`` as hivemind would send it, signed by this node's key (also when ``subkey`` is not ours)."""
        record = DHTRecord(DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey), value, expiration)
        if forge:
            signature = self.key.sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
            return value + b"[signature:" + signature + b"]"
        return self.signer.sign_value(record)

    def store_at(self, peer: Any, key: str, subkey: bytes, raw_value: bytes, expiration: float) -> bool | None:
        """Send one raw store RPC to ``peer``; returns its answer (None: no answer)."""
        result = self.run(
            self.node.protocol.call_store(
                peer.peer.libp2p_peer_id, [DHTID.generate(source=key)], [raw_value], [expiration], subkeys=[subkey]
            )
        )
        return None if result is None else result[0]

    def close(self) -> None:
        """Shut the node and its p2pd down, then stop and close its loop."""

        async def shutdown() -> None:
            await self.node.shutdown()
            await close_p2p(self.node.p2p)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(20)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            if not self.thread.is_alive():
                close_stopped_loop(self.loop)


# ------------------------------------------------------------------------------------------------
# what a hostile peer sends


def unchecked_record(groups: list[Any], created_at: float | None = None) -> bytes:
    """A record packed without the publisher's checks, as a buggy or hostile peer sends it.

    ``groups`` holds :class:`swarm.records.Group` objects or raw wire dicts (anything msgpack packs).
    """
    wire = {
        "version": WIRE_VERSION,
        "created_at": time.time() if created_at is None else created_at,
        "groups": [group_to_wire(g) if isinstance(g, Group) else g for g in groups],
    }
    return msgpack.packb(wire, use_bin_type=True)


def publish_unchecked(peer: Any, data: bytes, num_groups: int = 1, created_at: float | None = None) -> None:
    """Queue raw record bytes on a :class:`swarm.dht.DHTTransport` as if they had passed ``publish()``'s checks:
    the peer signs and stores them with the real protocol, and advertises them in its index entry and announcement
    as holding ``num_groups`` groups, dated ``created_at`` (default: now), whatever they hold (an inflated claim)."""
    peer.publisher.queue_encoded(data, num_groups, time.time() if created_at is None else created_at)
    peer.peer.wake("publish")


def announce_identities(peer: Any, keys: list[RSAPrivateKey], pause: float = 0.02) -> int:
    """Have :class:`swarm.dht.DHTTransport` ``peer`` announce "still here" once under each of ``keys`` on its
    announcement topics: one libp2p host making a fresh identity per key, as an attacker's peer does for the price of
    a key. Returns how many announcements went out."""
    from swarm.announcements import encode_announcement

    sent = 0
    for key in keys:
        data = encode_announcement(key, peer.config.swarm_name, "sybil", time.time(), None, [])
        sent += asyncio.run_coroutine_threadsafe(peer.gossip.announce(data), peer.peer.loop).result(10)
        time.sleep(pause)  # GossipSub queues a few dozen messages per peer: a burst beyond that is dropped
    return sent


def poisoned_groups(rows: list[dict[str, Any]], marker: str = "POISON") -> dict[str, tuple[Group | dict, str]]:
    """Groups a lying peer publishes, by kind, each with the counter an honest node must raise for it.

    Built from real reasoning-gym ``rows`` (``prompt``, ``answer``, ``provenance`` columns). Every completion
    contains ``f"{marker}-{kind}"`` so a test can tell whether it was ever trained on. Counters are
    ``swarm/rejected/<reason>`` (the transport refuses the record) or ``sapo/total/dropped/<reason>`` (the
    trainer's verifier drops the group); ``wrong_answer`` is a usable question whose claimed answer is a lie, with
    reward spread (two completions give the true answer, two the claimed one) so that a sampler keeps it and it is
    trained on: only with the ground truth the receiver re-derives (the true completions score 1, the lie 0).
    """

    def group(kind: str, row: dict[str, Any], completions: list[Any] | None = None, **changes: Any) -> Group:
        wrong = wrong_answer(str(row["answer"]))
        fields: dict[str, Any] = dict(
            group_id=f"{marker}-{kind}",
            prompt=list(row["prompt"]),
            completions=completions or [f"{marker}-{kind} <answer>{wrong}</answer>"] * 4,
            provenance=Provenance(**json.loads(row["provenance"])),
            metadata={"answer": wrong},
            model="liar",
            step=1,
            created_at=time.time(),
        )
        fields.update(changes)
        return Group(**fields)

    a, b, c = rows[0], rows[1], rows[2]
    question = a["prompt"][-1]["content"]
    tag = f"{marker}-"
    return {
        "wrong_answer": (
            group(
                "wrong_answer",
                a,
                completions=[f"{tag}wrong_answer-truth <answer>{a['answer']}</answer>"] * 2
                + [f"{tag}wrong_answer-lie <answer>{wrong_answer(str(a['answer']))}</answer>"] * 2,
            ),
            "trained_with_own_truth",
        ),
        "question_not_matching_provenance": (
            group("question_not_matching_provenance", b, prompt=[{"role": "user", "content": question + " (2+2?)"}]),
            "sapo/total/dropped/question_mismatch",
        ),
        "unknown_task": (
            group("unknown_task", c, provenance=Provenance("reasoning_gym", "no_such_task", {}, seed=1, index=0)),
            "sapo/total/dropped/unknown_task",
        ),
        "expensive_config": (  # takes minutes to regenerate: the receiver must give up, not stall
            group(
                "expensive_config",
                c,
                provenance=Provenance(
                    "reasoning_gym",
                    "rubiks_cube",
                    {"min_scramble_steps": 2_000_000, "max_scramble_steps": 2_000_000},
                    seed=1,
                    index=0,
                ),
            ),
            "sapo/total/dropped/regeneration_limit",
        ),  # fmt: skip
        "empty_completions": (
            group("empty_completions", a, completions=["", "", "", ""]),
            "swarm/rejected/empty_group",
        ),
        "huge_completion": (
            group("huge_completion", a, completions=[tag + "huge " + "x" * 200_000] + [tag + "huge"] * 3),
            "swarm/rejected/completion_too_long",
        ),
        "non_text_completions": (
            {**group_to_wire(group("non_text_completions", a)), "completions": [1, 2.5, None, [tag]]},
            "swarm/rejected/schema",
        ),
        "too_many_completions": (
            group("too_many_completions", a, completions=[tag + "many"] * 10_000),
            "swarm/rejected/too_many_completions",
        ),
    }


def wire_attacks(raw: HostileNode, victim: Any, sample: Group) -> dict[str, str]:
    """Send one store RPC of each wire-level attack straight to ``victim`` (a DHTTransport); returns, by kind,
    the counter the victim must raise. ``sample`` is a valid group used where the attack needs one."""
    dumps = MSGPackSerializer.dumps
    swarm_name = victim.config.swarm_name
    key = record_key(swarm_name, victim.peer_id, 1)
    own_key = record_key(swarm_name, "hostile", 1)
    good = dumps(unchecked_record([sample]))
    signed = dict(sign=True, forge=False)
    attacks = {  # kind: (counter the victim raises, key, subkey, value, seconds to expiry, how it is signed)
        "random_bytes": ("not_msgpack", own_key, raw.marker, random_bytes(2000), 60, signed),
        "wrong_schema": ("schema", own_key, raw.marker, dumps(dumps({"version": 1})), 60, signed),
        "oversized_record": ("too_large", own_key, raw.marker, dumps(random_bytes(3_500_000)), 60, signed),
        "forged_subkey": ("bad_signature", key, victim_marker(victim), good, 60, dict(sign=True, forge=True)),
        "unsigned": ("bad_signature", key, b"no owner here", good, 60, dict(sign=False, forge=False)),
        "never_expiring": ("ttl_too_long", own_key, raw.marker, good, 3e8, signed),
    }
    for _, key_, subkey, value, ttl, how in attacks.values():
        expiration = time.time() + ttl
        sent = raw.signed(key_, subkey, value, expiration, forge=how["forge"]) if how["sign"] else value
        raw.store_at(victim, key_, subkey, sent, expiration)
    return {kind: f"swarm/rejected/{spec[0]}" for kind, spec in attacks.items()}


def burst(raw: HostileNode, victim: Any, sample: Group, count: int, per_rpc: int = 100) -> int:
    """Store ``count`` validly signed records under the hostile node's own keys at ``victim``, ``per_rpc`` per
    store RPC, as fast as the victim answers; returns how many the victim accepted."""
    dumps = MSGPackSerializer.dumps
    value = dumps(unchecked_record([sample]))
    accepted = 0
    for start in range(0, count, per_rpc):
        keys = [record_key(victim.config.swarm_name, "hostile", n) for n in range(start, min(count, start + per_rpc))]
        expiration = time.time() + 120
        values = [raw.signed(key, raw.marker, value, expiration) for key in keys]
        answers = raw.run(
            raw.node.protocol.call_store(
                victim.peer.libp2p_peer_id,
                [DHTID.generate(source=key) for key in keys],
                values,
                [expiration] * len(keys),
                subkeys=[raw.marker] * len(keys),
            )
        )
        accepted += sum(bool(a) for a in answers or [])
    return accepted


def victim_marker(victim: Any) -> bytes:
    """The owner subkey protecting the records of ``victim``."""
    from swarm.validation import owner_marker

    return owner_marker(victim.public_key)


def random_bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def odd_key(modulus_bits: int = 2048, exponent_bits: int = 17, seed: int = 0) -> RSAPrivateKey:
    """A working RSA signing key of any modulus size and a public exponent of ``exponent_bits`` bits (17: 65537):
    what a peer that picks what verifying its signatures costs signs with (2040 bits take ~10 ms a check against
    ~0.2 ms for 65537)."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    base = rsa.generate_private_key(public_exponent=65537, key_size=modulus_bits)
    if exponent_bits == 17:
        private = base
    else:
        numbers = base.private_numbers()
        p, q = numbers.p, numbers.q
        phi, rng = (p - 1) * (q - 1), random.Random(seed)
        while True:
            e = rng.getrandbits(exponent_bits) | (1 << (exponent_bits - 1)) | 1
            if math.gcd(e, phi) == 1:
                break
        d = pow(e, -1, phi)
        public = rsa.RSAPublicNumbers(e, p * q)
        private = rsa.RSAPrivateNumbers(p, q, d, d % (p - 1), d % (q - 1), rsa.rsa_crt_iqmp(p, q), public).private_key()
    return signing_key(private)  # hivemind's class only generates 2048-bit keys: wrap this one


# ------------------------------------------------------------------------------------------------
# the scenario


class ExactAnswer:
    """Reward 1 for `<answer>TRUTH</answer>`, recording every row TRL trains on (calls with completion_ids)."""

    __name__ = "exact_answer"

    def __init__(self) -> None:
        self.trained: list[tuple[str, float]] = []  # (completion, reward) of every trained row

    def __call__(self, prompts, completions, answer, completion_ids=None, **columns):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [1.0 if f"<answer>{a}</answer>" in t else 0.0 for t, a in zip(texts, answer, strict=True)]
        if completion_ids is not None:
            self.trained.extend(zip(texts, rewards, strict=True))
        return rewards


def honest_group(row: dict, gid: str) -> Group:
    truth = row["answer"]
    return Group(
        group_id=gid,
        prompt=list(row["prompt"]),
        completions=[f"friend <answer>{truth}</answer>", "friend no idea", f"<answer>{truth}</answer>", "friend 0"],
        provenance=Provenance(**json.loads(row["provenance"])),
        metadata={"answer": truth},
        model="friend",
        step=1,
        created_at=time.time(),
    )


def hostile_round(
    workdir: Path,
    tokenizer: Any,
    make_peer: Callable[..., Any],
    burst_size: int = 1000,
    steps: int = 3,
    on_p2pd: Callable[[int, list[str]], None] | None = None,
) -> dict[str, Any]:
    """One honest SAPOTrainer (tiny model) on a real DHT beside a friend, a liar and a raw hostile node.

    The friend publishes 2 honest groups, the liar one record per kind of :func:`poisoned_groups`, the raw
    node every :func:`wire_attacks` kind and a burst of ``burst_size`` records; then the honest node trains
    ``steps`` steps. ``make_peer(**config)`` makes a DHTTransport and owns its cleanup. Returns what happened:
    the trainer, the expected counter of each kind, every trained row, the burst's figures. ``on_p2pd`` is told
    of the raw node's p2pd daemon (see :class:`HostileNode`).
    """
    from sapo.tasks import build_reasoning_gym_dataset
    from testbed.tiny_run import tiny_trainer  # here: the flood benchmark's hostile process never trains

    rows = list(build_reasoning_gym_dataset(TASKS, size=32, seed=5))
    honest = make_peer(model_name="honest")
    friend = make_peer(model_name="friend", initial_peers=honest.visible_addresses())
    liar = make_peer(model_name="liar", initial_peers=honest.visible_addresses())
    raw = HostileNode(honest.visible_addresses(), on_p2pd=on_p2pd)
    try:
        friend.publish([honest_group(rows[10 + i], f"friend-{i}") for i in range(2)])
        attacks = poisoned_groups(rows)
        for group, _ in attacks.values():  # one record per kind: a bad one must not hide a good one
            publish_unchecked(liar, unchecked_record([group]))
        expected = {kind: counter for kind, (_, counter) in attacks.items()}
        expected |= wire_attacks(raw, honest, honest_group(rows[20], "sample"))
        started = time.monotonic()
        accepted = burst(raw, honest, honest_group(rows[21], "burst"), count=burst_size)
        burst_seconds = time.monotonic() - started
        # the friend's 2 groups and the liar's 4 schema-valid ones reach the honest peer's cache: training before the
        # liar's usable group arrived would bench the liar for its bad ones and never fetch that group
        deadline = time.monotonic() + 60
        while honest.readout().counters.get("received_groups", 0) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)

        reward = ExactAnswer()
        trainer = tiny_trainer(
            workdir / "honest",
            tokenizer,
            [reward],
            build_reasoning_gym_dataset(TASKS, size=32, seed=5),
            honest,
            num_local=1,
            num_external=3,
            max_steps=steps,
            learning_rate=1e-2,
            logging_steps=1,
            sampling_strategy="uniform",
            external_pool_size=16,
            regeneration_timeout=3.0,  # the expensive config is given up after 3 s
            # every published completion fits whole (the tagged ones are ~20 tokens): a longer one would be cut
            # and scored as cut, losing its <answer> and the truth-versus-lie rewards this round checks
            max_completion_length=32,
        )
        trainer.train()
    finally:
        raw.close()
    return {
        "trainer": trainer,
        "expected": expected,
        "trained": reward.trained,
        "burst_accepted": accepted,
        "burst_seconds": burst_seconds,
        "friend": friend.peer_id,
        "liar": liar.peer_id,
    }


def poisoned_rows_trained(trained: list[tuple[str, float]], marker: str = "POISON") -> int:
    """Trained rows of a forged or poisoned group: any marked row but the usable question's, and that one's rows
    only if they were scored with the sender's lie (the lie rewarded, or the true answer not)."""

    def poisoned(text: str, reward: float) -> bool:
        if text.startswith(f"{marker}-wrong_answer"):
            return (reward > 0) != text.startswith(f"{marker}-wrong_answer-truth")
        return marker in text

    return sum(1 for text, reward in trained if poisoned(text, reward))


def wrong_answer(true: str) -> str:
    """An answer that is not ``true``: what a liar claims."""
    return str(int(true) + 1) if true.lstrip("-").isdigit() else true + "0"


def store_raw(
    hostile: HostileNode, peer_id: Any, key: str, tag: bytes, value: bytes, expiration: float, copies: int = 1
) -> list[bool]:
    """One store RPC from ``hostile`` to the libp2p peer ``peer_id`` with the subkey bytes ``tag`` as they are (a bomb
    may sit in the subkey, which hivemind's own call would serialize): the peer's answers. With ``copies``, the
    request holds the value that many times, under ``key`` and then keys ``key/1``, ``key/2``, ..."""
    from hivemind.proto import dht_pb2

    keys = [key, *(f"{key}/{n}" for n in range(1, copies))]
    request = dht_pb2.StoreRequest(
        keys=[DHTID.generate(source=k).to_bytes() for k in keys],
        subkeys=[tag] * copies,
        values=[value] * copies,
        expiration_time=[expiration] * copies,
        in_cache=[False] * copies,
        peer=hostile.node.protocol.node_info,
    )
    stub = hostile.node.protocol.get_stub(peer_id)
    return list(hostile.run(stub.rpc_store(request, timeout=20)).store_ok)
