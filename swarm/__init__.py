"""Swarm transport: publish and fetch groups of rollouts as signed, validated text records."""

import os

# hivemind switches PyTorch's tensor sharing between processes to shared files when it is imported, which starts a
# torch_shm_manager process that outlives the processes that shared a tensor; the swarm shares no tensors between
# processes, so PyTorch's own default (file descriptors) is kept unless the operator says otherwise.
os.environ.setdefault("HIVEMIND_MEMORY_SHARING_STRATEGY", "file_descriptor")

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
