"""Asking one swarm peer before a node joins: its clock against this machine's, and the wire version it announces.

`sapo-node doctor` starts a short-lived hivemind peer (its own p2pd, in client mode: it stores nothing and no peer
adds it to its routing table), pings the initial peer as hivemind's DHT does (the answer carries the peer's clock),
reads level 0 of the swarm's index (`swarm.validation.index_keys`) and reads the version each entry announces,
then leaves. Nothing here is written to the swarm.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

PINGS = 3


@dataclass(frozen=True)
class PeerProbe:
    """What one initial peer said.

    Parameters:
        address (`str`): the multiaddr asked.
        error (`str` or `None`): why the peer could not be asked (nothing else is set then).
        clock_offset (`float` or `None`): the peer's clock minus this machine's, in seconds, from the ping with the
            shortest round trip (it is off by at most half that round trip).
        round_trip (`float` or `None`): that ping's round trip, in seconds.
        peer_versions (`list[int]`): the wire versions the peer's own index entries announce (an entry names the
            libp2p id that serves its records); empty when none was found.
        listed_versions (`dict[int, int]`): how many index entries of level 0 announce each wire version.
    """

    address: str
    error: str | None = None
    clock_offset: float | None = None
    round_trip: float | None = None
    peer_versions: list[int] = field(default_factory=list)
    listed_versions: dict[int, int] = field(default_factory=dict)


def probe_peer(address: str, swarm_name: str, index_shards: int, timeout: float = 20.0) -> PeerProbe:
    """Ask the peer at ``address`` (a multiaddr ending in `/p2p/<id>`) for its clock and the swarm's index of
    ``swarm_name`` (``index_shards`` shards at level 0); never raises: a failure is the probe's ``error``."""
    try:
        return asyncio.run(asyncio.wait_for(_probe(address, swarm_name, index_shards, timeout), 3 * timeout))
    except Exception as e:  # a peer that cannot be asked is a finding, not a crash of the doctor
        return PeerProbe(address, error=f"{type(e).__name__}: {e}".rstrip(": "))


async def _probe(address: str, swarm_name: str, index_shards: int, timeout: float) -> PeerProbe:
    from hivemind.dht.node import DHTNode
    from hivemind.p2p import P2P, PeerID
    from hivemind.utils.multiaddr import Multiaddr

    from swarm.config import nat_options
    from swarm.daemon import close_p2p
    from swarm.dht_values import TypedDHTSerializer
    from swarm.records import RecordLimits

    peer = PeerID.from_base58(Multiaddr(address)["p2p"])
    listen = ["/ip4/127.0.0.1/tcp/0"]  # it only dials out: no port mapping, no AutoNAT (nat_options)
    p2p = await asyncio.wait_for(
        P2P.create(initial_peers=[address], host_maddrs=listen, dht_mode="client", **nat_options(listen)), timeout
    )
    node = None
    try:
        node = await asyncio.wait_for(
            DHTNode.create(
                p2p=p2p, initial_peers=[address], client_mode=True, record_validator=_signature_check(),
                ensure_bootstrap_success=False, wait_timeout=timeout / 2, cache_locally=False,
            ),
            timeout,
        )  # fmt: skip
        node.protocol.serializer = TypedDHTSerializer(RecordLimits().max_record_bytes, lambda reason, detail: None)
        offset, round_trip = await _clock_offset(node, peer, timeout)
        peer_versions, listed = await _announced_versions(node, peer.to_base58(), swarm_name, index_shards, timeout)
        return PeerProbe(address, None, offset, round_trip, peer_versions, listed)
    finally:
        if node is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(node.shutdown(), 10)
        await close_p2p(p2p)


async def _clock_offset(node: Any, peer: Any, timeout: float) -> tuple[float, float]:
    """(peer's clock minus ours, round trip) of the ping with the shortest round trip among :data:`PINGS`."""
    from hivemind.proto import dht_pb2

    stub = node.protocol.get_stub(peer)
    samples = []
    for _ in range(PINGS):
        sent = time.time()
        # An empty PingRequest: the peer answers with its time and does not add us to its routing table.
        answer = await stub.rpc_ping(dht_pb2.PingRequest(), timeout=timeout)
        received = time.time()
        samples.append((received - sent, answer.dht_time - (sent + received) / 2))
    round_trip, offset = min(samples)
    return offset, round_trip


def _signature_check() -> Any:
    """The owner-signature check of the swarm, with a throwaway key: entries of any wire version pass it, so that
    the probe reads the version a peer announces even where this node's schema would refuse the entry."""
    from hivemind.dht.validation import CompositeValidator
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm.validation import OwnerSignatureValidator

    return CompositeValidator([OwnerSignatureValidator(RSAPrivateKey(), lambda reason, detail: None)])


async def _announced_versions(
    node: Any, peer_id: str, swarm_name: str, index_shards: int, timeout: float
) -> tuple[list[int], dict[int, int]]:
    from swarm.validation import index_keys

    found = await asyncio.wait_for(node.get_many(index_keys(swarm_name, index_shards, 0)), timeout)
    peer_versions: list[int] = []
    listed: Counter[int] = Counter()
    for shard in found.values():
        if shard is None or not isinstance(shard.value, dict):
            continue
        for item in shard.value.values():
            entry = announced_entry(item.value)
            if entry is None:
                continue
            listed[entry["version"]] += 1
            if entry.get("host") == peer_id:
                peer_versions.append(entry["version"])
    return sorted(set(peer_versions)), dict(sorted(listed.items()))


class _AnyVersionEntry(msgspec.Struct):
    """What the probe reads of an index entry of any wire version; its other keys are skipped, not decoded."""

    version: int
    host: str | None = None


_ANY_VERSION_ENTRY = msgspec.msgpack.Decoder(_AnyVersionEntry)
_MAX_ENTRY_BYTES = 1 << 16  # an index entry is a few KB at any version so far


def announced_entry(value: Any) -> dict[str, Any] | None:
    """The ``version`` and ``host`` of an index entry as its writer packed them, read without this node's schema so
    that an entry of another wire version is read too; None for anything that is not a versioned entry. Decoded
    typed from the bytes, their size checked first, as every peer's bytes are."""
    if not isinstance(value, bytes) or len(value) > _MAX_ENTRY_BYTES:
        return None
    try:
        entry = _ANY_VERSION_ENTRY.decode(value)
    except (msgspec.DecodeError, RecursionError):  # hostile or torn bytes: not an entry
        return None
    return {"version": entry.version, "host": entry.host}
