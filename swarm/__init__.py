"""Swarm transport: publish and fetch groups of rollouts as signed, validated text records."""

from swarm.memory import MemorySwarm, MemoryTransport
from swarm.records import (
    Group,
    GroupRecord,
    Provenance,
    ReceivedGroup,
    RecordLimits,
    RecordRejected,
)
from swarm.transport import PeerInfo, SwarmTransport

__all__ = [
    "Group",
    "GroupRecord",
    "MemorySwarm",
    "MemoryTransport",
    "PeerInfo",
    "Provenance",
    "ReceivedGroup",
    "RecordLimits",
    "RecordRejected",
    "SwarmTransport",
]
