"""The flood benchmark's settings and its hostile peer (:mod:`benchmarks.flood`, issue 61).

The hostile peer runs in a process of its own (an attacker's machine, not the victim's interpreter): it joins the
victim's swarm and, for a bounded time, sends what :mod:`benchmarks.flood`'s docstring lists, from one thread per
attack (the store storm, the bombs, the inflated claims, the crowding records, the fresh and forged identities).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import os
import threading
import time
from collections import Counter
from typing import Any


@dataclasses.dataclass
class FloodSettings:
    """One run's settings (the defaults are the committed run's)."""

    steps: int = 8
    """Training steps per condition."""
    min_window_seconds: float = 0.0
    """The measured window's shortest length: after its last step the victim, still attacked, waits until the window
    has lasted this long (0: the steps alone). For a short run on a fast CPU, where two steps take about a second."""
    num_external: int = 2
    """Groups of others the victim trains on per step."""
    honest_interval: float = 1.0
    """Seconds between two groups the honest peer publishes."""
    attack_seconds: float = 120.0
    """The attack's longest duration (it stops earlier when the victim's training ends)."""
    storm_rate: float = 1000.0
    """Forged-signature store values sent a second."""
    storm_batch: int = 50
    """Values per store RPC."""
    bomb_interval: float = 3.0
    """Seconds between two 3 MiB bombs."""
    claim_rate: float = 10.0
    """Inflated records (dated 2 s ahead, claiming 8 groups) published a second."""
    identities: int = 24
    """Fresh identities announced over the attack."""
    forged_announcement_rate: float = 10.0
    """Announcements with a forged signature a second."""
    crowd_rate: float = 2.0
    """Crowding records (dated 2 s ahead, truly holding ``crowd_groups`` groups) published a second."""
    crowd_groups: int = 32
    """Groups of one crowding record: of a task source the victim does not hold, so it sets them aside as
    ``unknown_source``, which never counts against their sender."""


def attacker(addresses: list[str], victim: str, settings: FloodSettings, ready: Any, stop: Any, out: Any) -> None:
    """The hostile peer, run in its own process: joins through ``addresses``, sets ``ready`` once its keys are made,
    attacks the victim (libp2p id ``victim``, base58) until ``stop`` or ``attack_seconds``, then puts what it sent on
    ``out`` (``("p2pd", pids)`` first, so the parent can stop its daemons if this process dies)."""
    from hivemind.p2p import PeerID
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm.dht import DHTTransport
    from swarm.hivemind_bridge import daemon_process
    from testbed.hostile_peer import HostileNode, unchecked_record

    raw = HostileNode(addresses)
    hostile = crowd = None
    sent: Counter[str] = Counter()
    try:
        hostile = DHTTransport(model_name="hostile", initial_peers=addresses)
        # the crowding records come from an identity of their own: the inflated claims' strikes rest the other one
        crowd = DHTTransport(model_name="crowd", initial_peers=addresses)
        out.put(("p2pd", [daemon_process(raw.node.p2p).pid, hostile.p2pd_pid, crowd.p2pd_pid]))
        keys = [RSAPrivateKey() for _ in range(settings.identities)]
        ready.set()
        peer_id = PeerID.from_base58(victim)
        deadline = time.monotonic() + settings.attack_seconds
        done = threading.Event()
        swarm_name = hostile.config.swarm_name
        sample = unchecked_record([_group("sample")])
        threads = [
            threading.Thread(target=job, args=args, daemon=True)
            for job, args in (
                (_storm, (raw, peer_id, swarm_name, sample, settings, done, sent)),
                (_bombs, (raw, hostile, peer_id, swarm_name, settings, done, sent)),
                (_claims, (hostile, settings, done, sent)),
                (_crowd, (crowd, settings, done, sent)),
                (_identities, (hostile, keys, settings, done, sent)),
            )
        ]
        for thread in threads:
            thread.start()
        while not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        done.set()
        for thread in threads:
            thread.join(30)
        sent["attack_seconds"] = round(settings.attack_seconds - max(0.0, deadline - time.monotonic()))
    finally:
        for transport in (hostile, crowd):
            with contextlib.suppress(Exception):
                if transport is not None:
                    transport.close()
        raw.close()
        out.put(("sent", dict(sent)))


def _group(group_id: str, created_at: float | None = None) -> Any:
    from swarm.records import Group, Provenance

    return Group(
        group_id=group_id,
        prompt=[{"role": "user", "content": "What is 2 + 3?"}],
        completions=["<answer>5</answer>", "5", "<answer>6</answer>", "no"],
        provenance=Provenance("reasoning_gym", "basic_arithmetic", {}, seed=5, index=0),
        metadata={"answer": "5"},
        model="hostile",
        step=1,
        created_at=time.time() if created_at is None else created_at,
    )


def _forged(value: bytes) -> bytes:
    """``value`` with a signature block of random bytes: verified (and refused) at the victim's cost."""
    return value + b"[signature:" + base64.b64encode(os.urandom(256)) + b"]"


def _storm(raw: Any, peer_id: Any, swarm_name: str, sample: bytes, settings: FloodSettings, done: Any, sent: Counter):
    """Forged-signature stores, ``storm_rate`` values a second, at most 8 RPCs in flight (the victim's answers pace
    the rest)."""
    from hivemind.dht.routing import DHTID
    from hivemind.utils.serializer import MSGPackSerializer

    dumps = MSGPackSerializer.dumps
    keys = [record_key_of(swarm_name, n) for n in range(settings.storm_batch)]
    ids, subkey = [DHTID.generate(source=key) for key in keys], dumps(raw.marker)
    values = [_forged(dumps(sample)) for _ in keys]

    async def storm() -> None:
        pending: set[asyncio.Task] = set()
        pause = settings.storm_batch / settings.storm_rate
        while not done.is_set():
            if len(pending) < 8:
                expiration = time.time() + 60
                call = raw.node.protocol.call_store(
                    peer_id, ids, values, [expiration] * len(ids), subkeys=[subkey] * len(ids)
                )
                task = asyncio.ensure_future(call)
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent["forged_store_values"] += len(ids)
                sent["forged_store_rpcs"] += 1
            else:
                sent["storm_waits"] += 1
            await asyncio.sleep(pause)
        for task in list(pending):
            task.cancel()

    raw.run(storm(), timeout=settings.attack_seconds + 30)


def record_key_of(swarm_name: str, n: int) -> str:
    """The DHT key of the hostile peer's ``n``-th record."""
    from swarm.validation import record_key

    return record_key(swarm_name, "hostile", n)


def _bombs(raw: Any, hostile: Any, peer_id: Any, swarm_name: str, settings: FloodSettings, done: Any, sent: Counter):
    """A 3 MiB bomb every ``bomb_interval`` seconds, in turn on every path the hostile peer reaches."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils.serializer import MSGPackSerializer

    from swarm.pubsub import publish
    from swarm.validation import index_keys
    from testbed.bombs import bomb, dictionary_bomb, index_bomb, record_bomb, subkey_bomb
    from testbed.hostile_peer import publish_unchecked, store_raw, unchecked_record

    dumps, marker = MSGPackSerializer.dumps, MSGPackSerializer.dumps(raw.marker)
    index = index_keys(swarm_name, hostile.config.index_shards)

    def stored(key: str, tag: bytes, value: bytes, expiration: float) -> None:
        with contextlib.suppress(Exception):  # the victim may drop the RPC: it is sent either way
            store_raw(raw, peer_id, key, tag, value, expiration)

    def record(expiration: float) -> None:
        key = record_key_of(swarm_name, 10_000)
        stored(key, marker, raw.signed(key, raw.marker, dumps(record_bomb()), expiration), expiration)

    def index_entry(expiration: float) -> None:
        stored(index[0], marker, raw.signed(index[0], raw.marker, dumps(index_bomb()), expiration), expiration)

    def subkey(expiration: float) -> None:
        key = record_key_of(swarm_name, 10_001)
        tag = subkey_bomb(raw.key.get_public_key().to_bytes())
        good = dumps(unchecked_record([_group("bomb-subkey")]))
        record_id = DHTID.generate(source=key).to_bytes()
        stored(key, tag, raw.signer.sign_value(DHTRecord(record_id, tag, good, expiration)), expiration)

    def dictionary(expiration: float) -> None:
        stored(record_key_of(swarm_name, 10_002), b"", dictionary_bomb(), expiration)

    def forged(expiration: float) -> None:
        stored(record_key_of(swarm_name, 10_003), marker, _forged(dumps(record_bomb())), expiration)

    def served(expiration: float) -> None:
        publish_unchecked(hostile, record_bomb(), num_groups=1)

    def announcement(expiration: float) -> None:
        for topic in hostile.gossip.topics():
            with contextlib.suppress(Exception):
                _on_loop(hostile, publish(hostile.peer.p2p, topic, bomb(size=60_000)))

    def lookup(expiration: float) -> None:
        # the hostile DHT node holds a signed index bomb under every index key: any index read that asks it gets one
        for key in index:
            value = raw.signed(key, raw.marker, dumps(index_bomb()), expiration)
            raw.node.protocol.storage.store_subkey(DHTID.generate(source=key), marker, value, expiration)

    paths = {
        "store_record": record,
        "served_record": served,
        "announcement_60KB": announcement,
        "lookup_index_entry": lookup,
        "store_index_entry": index_entry,
        "store_subkey": subkey,
        "store_dictionary": dictionary,
        "store_forged_signature": forged,
    }
    turn = 0
    while not done.wait(settings.bomb_interval if turn else 0.0):
        name, send = list(paths.items())[turn % len(paths)]
        send(time.time() + 60)
        sent[f"bombs/{name}"] += 1
        sent["bombs"] += 1
        turn += 1


def _claims(hostile: Any, settings: FloodSettings, done: Any, sent: Counter) -> None:
    """Records dated 2 s ahead claiming 8 groups, holding one."""
    from testbed.hostile_peer import publish_unchecked, unchecked_record

    n = 0
    while not done.wait(1 / settings.claim_rate):
        ahead = time.time() + 2.0
        publish_unchecked(hostile, unchecked_record([_group(f"inflated-{n}", ahead)], ahead), 8, ahead)
        sent["inflated_records"] += 1
        n += 1


def _crowd(hostile: Any, settings: FloodSettings, done: Any, sent: Counter) -> None:
    """Records dated 2 s ahead that truly hold ``crowd_groups`` groups of a source the victim does not hold: they
    break no claim and no check that counts against their sender, and before the fair take they filled every take
    (the freshest first, whoever sent them) while their number told the refill that nothing more was wanted."""
    from swarm.records import Provenance
    from testbed.hostile_peer import publish_unchecked, unchecked_record

    n = 0
    while not done.wait(1 / settings.crowd_rate):
        ahead = time.time() + 2.0
        groups = [
            dataclasses.replace(_group(f"crowd-{n}-{i}", ahead), provenance=Provenance("unheard_of", "x", {}, 0, i))
            for i in range(settings.crowd_groups)
        ]
        publish_unchecked(hostile, unchecked_record(groups, ahead), len(groups), ahead)
        sent["crowd_records"] += 1
        sent["crowd_groups"] += len(groups)
        n += 1


def _identities(hostile: Any, keys: list, settings: FloodSettings, done: Any, sent: Counter) -> None:
    """Each key announced once (a fresh identity), spread over the attack; forged announcements between them."""
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm.announcements import encode_announcement
    from swarm.pubsub import publish

    name, pause = hostile.config.swarm_name, 1 / settings.forged_announcement_rate
    every = max(1, int(settings.attack_seconds / max(1, len(keys)) / pause))
    n = 0
    while not done.wait(pause):
        topics = hostile.gossip.topics()
        if n % every == 0 and keys:
            data = encode_announcement(keys.pop(), name, "sybil", time.time(), None, [])
            sent["fresh_identities"] += 1
        else:  # a forged signature: the announcement's last field replaced by random bytes
            data = encode_announcement(RSAPrivateKey.process_wide(), name, "forged", time.time(), None, [])
            data = data[:-256] + os.urandom(256)
            sent["forged_announcements"] += 1
        for topic in topics:
            with contextlib.suppress(Exception):
                _on_loop(hostile, publish(hostile.peer.p2p, topic, data))
        n += 1


def _on_loop(peer: Any, coroutine: Any, timeout: float = 10) -> Any:
    return asyncio.run_coroutine_threadsafe(coroutine, peer.peer.loop).result(timeout)
