"""What the transport benchmark counts: a process's I/O bytes, TCP traffic between peers by socket, and the DHT
RPC and served-record bytes a peer serves, by kind (for `benchmarks.swarm_transport`)."""

from __future__ import annotations

import collections
import functools
import subprocess
from collections.abc import Callable
from typing import Any


def io_bytes(pid: int) -> int:
    """Bytes ``pid`` read plus wrote through system calls (sockets included)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            fields = dict(line.split(":") for line in f)
        return int(fields["rchar"]) + int(fields["wchar"])
    except (OSError, KeyError, ValueError):
        return 0


def tcp_sockets(pids: set[int]) -> dict[tuple[str, str], dict[str, int]]:
    """TCP sockets of the processes ``pids`` (from ``ss -tinp``): ``{(local, remote): {"pid", "sent", "received"}}``
    with the bytes each socket has sent and received since it opened; empty if ``ss`` is missing."""
    try:
        out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    sockets: dict[tuple[str, str], dict[str, int]] = {}
    current: tuple[str, str] | None = None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):  # a socket line; its figures follow on an indented line
            fields, current = line.split(), None
            owner = next((f for f in fields if f.startswith("users:")), "")
            pid = next((int(p.split(",")[0]) for p in owner.split("pid=")[1:]), None)
            if pid in pids and len(fields) >= 5:
                current = (fields[3], fields[4])
                sockets[current] = {"pid": pid, "sent": 0, "received": 0}
        elif current is not None:
            for item in line.split():
                key, _, value = item.partition(":")
                if key in ("bytes_sent", "bytes_received") and value.isdigit():
                    sockets[current][key.removeprefix("bytes_")] = int(value)
    return sockets


def tcp_traffic(
    before: dict[tuple[str, str], dict[str, int]], after: dict[tuple[str, str], dict[str, int]], observers: set[int]
) -> dict[str, int]:
    """Bytes the peers' sockets sent + received between two :func:`tcp_sockets` snapshots, split into traffic with
    other peers and with the observers (the sockets whose remote end an observer's p2pd owns). Sockets closed in
    between are missed (libp2p keeps its connections, so few are)."""
    observer_ends = {local for snap in (before, after) for (local, _), s in snap.items() if s["pid"] in observers}
    traffic = {"peers": 0, "observers": 0, "sockets_closed": 0}
    for key, s in after.items():
        if s["pid"] in observers:
            continue
        old = before.get(key, {"sent": 0, "received": 0})
        moved = max(0, s["sent"] - old["sent"]) + max(0, s["received"] - old["received"])
        traffic["observers" if key[1] in observer_ends else "peers"] += moved
    traffic["sockets_closed"] = sum(1 for key, s in before.items() if key not in after and s["pid"] not in observers)
    return traffic


RECORD_VALUE_BYTES = 8192  # a found or stored value this large is a record (4 groups x 8 x 1500 chars); smaller: index


def count_rpc_bytes() -> dict[str, float]:
    """Wrap hivemind's DHT server handlers in this process to count the protobuf bytes of every request a peer
    serves and of its answer, by kind; requests of client-mode nodes (the observers) are left out. Returns the
    live tally: ``{kind: bytes}`` and ``{kind/calls: count}``. A diagnostic of where bytes go (``--rpc-bytes``)."""
    from hivemind.dht.protocol import DHTProtocol

    tally: collections.Counter = collections.Counter()

    def wrap(name: str, classify: Callable[[Any, Any], dict[str, int]]) -> None:
        handler = getattr(DHTProtocol, name)

        @functools.wraps(handler)  # hivemind reads the request and answer types from the handler's annotations
        async def counted(self: Any, request: Any, context: Any) -> Any:
            response = await handler(self, request, context)
            if request.peer.node_id:  # a DHT server: a peer, not an observer
                tally[f"{name}/calls"] += 1
                for kind, size in classify(request, response).items():
                    tally[kind] += size
            return response

        setattr(DHTProtocol, name, counted)

    def find(request: Any, response: Any) -> dict[str, int]:
        found = [len(r.value) for r in response.results]
        return {
            "find/request": request.ByteSize(),
            "find/record values": sum(n for n in found if n >= RECORD_VALUE_BYTES),
            "find/index values": sum(n for n in found if n < RECORD_VALUE_BYTES),
            "find/nearest peers": response.ByteSize() - sum(found),
        }

    def store(request: Any, response: Any) -> dict[str, int]:
        values = [len(v) for v in request.values]
        return {
            "store/record values": sum(n for n in values if n >= RECORD_VALUE_BYTES),
            "store/index values": sum(n for n in values if n < RECORD_VALUE_BYTES),
            "store/rest": request.ByteSize() - sum(values) + response.ByteSize(),
        }

    wrap("rpc_find", find)
    wrap("rpc_store", store)
    wrap("rpc_ping", lambda request, response: {"ping": request.ByteSize() + response.ByteSize()})
    count_served_bytes(tally)
    return tally


def count_served_bytes(tally: collections.Counter) -> None:
    """Count, in ``tally``, the records the peers of this process fetched from their publishers (swarm.served):
    counted where they are fetched, since a publisher cannot tell a peer's request from an observer's."""
    from swarm.served import PeerServedLookup, encode_answer

    get_served = PeerServedLookup.get_served

    @functools.wraps(get_served)
    async def counted(self: Any, host: str, key: str) -> Any:
        record = await get_served(self, host, key)
        tally["rpc_served/calls"] += 1
        tally["served/request"] += len(key)
        tally["served/record values"] += len(encode_answer(record)) if record is not None else 0
        return record

    PeerServedLookup.get_served = counted
