"""A userspace Ethernet switch with WAN-like links (delay, jitter, loss, bandwidth, up/down) for namespace hosts.

The kernel here has no ``netem`` qdisc, so links with delay and loss are made in Python: a process in the hub
namespace opens an ``AF_PACKET`` socket on each hub-side veth port, learns source MACs and forwards every frame
to its destination port (broadcast and unknown destinations to every other port). Each port is one host's
"cable" with its own :class:`Link` properties, applied in both directions: a frame from host A to host B
crosses A's uplink (A's loss, A's bandwidth queue, A's delay) then B's downlink (B's loss, queue and delay), so
a round trip between them takes at least ``2 * (delay_A + delay_B)``.

Links are changed at run time through a JSON control file that the switch re-reads when it changes; it
acknowledges each change (its ``generation``) in a JSON stats file, which also carries its counters.

Run as a subprocess by :class:`SwitchProcess` (``ip netns exec HUB python wan_switch.py --ports ...``); with
``--offloads-off DEV`` it instead turns off the checksum and segmentation offloads of ``DEV`` in the namespace it
runs in (there is no ``ethtool`` here), which the switch needs: see :func:`disable_offloads`. Only the standard
library is imported, so it starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import fcntl
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # pkttype of frames this host sent (ours included), seen again by a packet socket
SOL_PACKET = 263
PACKET_STATISTICS = 6
# Bytes a frame occupies on a wire besides its header and payload: preamble 8, FCS 4, inter-frame gap 12.
WIRE_OVERHEAD = 24
MAX_FRAME = 1514  # MTU 1500 + Ethernet header: anything larger is a GSO/GRO super-frame no port can send

# Legacy ethtool ioctls (linux/ethtool.h), still served by every kernel: "set" commands take {cmd, data}.
SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17
ETHTOOL_SSG = 0x19
ETHTOOL_STSO = 0x1F
ETHTOOL_SGSO = 0x24
ETHTOOL_SGRO = 0x2C


@dataclasses.dataclass
class Link:
    """One host's cable to the switch; every property applies to each direction separately."""

    delay_ms: float = 0.0  # one-way propagation delay
    jitter_ms: float = 0.0  # uniform extra delay in [0, jitter_ms]; frames of a link never overtake each other
    loss: float = 0.0  # probability that a frame is dropped, per direction
    rate_mbit: float = 0.0  # bandwidth; 0: unlimited (no serialisation delay)
    queue_ms: float = 250.0  # a frame that would wait longer than this for the bandwidth is dropped (tail drop)
    up: bool = True  # False: the cable is cut, every frame to or from the host is dropped


def disable_offloads(dev: str) -> None:
    """Turn off ``dev``'s TX checksum, scatter-gather, TSO, GSO and GRO (what ``ethtool -K`` does).

    Needed because a veth hands its peer frames with checksums left for "hardware" to fill in and TCP segments
    of up to 64 KB: a packet socket reads them as they are, and a frame re-sent through a packet socket is then
    dropped by the receiving host (bad checksum) or by the sending port (larger than the MTU).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for cmd in (ETHTOOL_SGRO, ETHTOOL_SGSO, ETHTOOL_STSO, ETHTOOL_SSG, ETHTOOL_STXCSUM):
            value = ctypes.create_string_buffer(struct.pack("II", cmd, 0))
            request = struct.pack("16sP", dev.encode(), ctypes.addressof(value))
            with contextlib.suppress(OSError):  # a feature the device cannot change is already what we want
                fcntl.ioctl(sock, SIOCETHTOOL, request)


# ------------------------------------------------------------------------------------------------
# the switch (runs in the hub namespace)


class Switch:
    """Forwards frames between packet sockets bound to ``ports``, applying each port's :class:`Link`."""

    def __init__(self, ports: list[str], control: Path, stats: Path, seed: int = 0):
        self.ports, self.control_path, self.stats_path = ports, control, stats
        self.rng = random.Random(seed)
        self.links = [Link() for _ in ports]
        self.generation = -1
        self.control_mtime = 0
        self.sockets: list[socket.socket] = []
        for port in ports:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # absorbs bursts while Python is busy
            sock.bind((port, ETH_P_ALL))
            sock.setblocking(False)
            self.sockets.append(sock)
        self.by_fd = {sock.fileno(): i for i, sock in enumerate(self.sockets)}
        self.macs: dict[bytes, int] = {}
        # (due time, sequence, stage, port, frame); stage 0: reaches the switch from `port`, 1: leaves on `port`
        self.heap: list[tuple[float, int, int, int, bytes]] = []
        self.seq = 0
        n = len(ports)
        self.up_free = [0.0] * n  # when each uplink's bandwidth is next free
        self.down_free = [0.0] * n
        self.up_last = [0.0] * n  # latest arrival scheduled per link: jitter must not reorder a link's frames
        self.down_last = [0.0] * n
        names = ("rx", "rx_bytes", "tx", "tx_bytes", "lost", "queue_drops", "down_drops", "oversize", "send_errors")
        self.counters = [dict.fromkeys(names, 0) for _ in ports]
        # how late frames left compared with their due time: the switch's own added delay
        self.lateness = {"n": 0, "sum_ms": 0.0, "max_ms": 0.0, "over_1ms": 0, "over_5ms": 0, "over_20ms": 0}
        self.started = time.monotonic()
        self.stopping = False

    # -- control and stats

    def read_control(self) -> None:
        """Apply the control file if it changed since the last read."""
        try:
            mtime = self.control_path.stat().st_mtime_ns
            if mtime == self.control_mtime:
                return
            data = json.loads(self.control_path.read_text())
        except (OSError, ValueError):
            return  # not written yet, or being replaced: read it again next time
        self.control_mtime = mtime
        self.links = [Link(**data["links"][i]) for i in range(len(self.ports))]
        self.generation = data["generation"]
        self.write_stats()  # the acknowledgement the controller waits for

    def kernel_drops(self, sock: socket.socket) -> int:
        """Frames the kernel dropped because this socket's buffer was full (since the last call)."""
        packets_drops = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        return struct.unpack("II", packets_drops)[1]

    def write_stats(self) -> None:
        """Write counters, lateness and CPU time to the stats file (atomically)."""
        for i, sock in enumerate(self.sockets):
            self.counters[i]["kernel_drops"] = self.counters[i].get("kernel_drops", 0) + self.kernel_drops(sock)
        data = {
            "generation": self.generation,
            "pid": os.getpid(),
            "uptime_s": time.monotonic() - self.started,
            "cpu_s": time.process_time(),
            "ports": dict(zip(self.ports, self.counters, strict=True)),
            "lateness": self.lateness,
            "queued": len(self.heap),
        }
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.stats_path)

    # -- forwarding

    def push(self, due: float, stage: int, port: int, frame: bytes) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (due, self.seq, stage, port, frame))

    def cross(self, port: int, frame: bytes, now: float, free: list[float], last: list[float]) -> float | None:
        """When ``frame`` gets to the far end of ``port``'s link in one direction; None if it is dropped."""
        link, counters = self.links[port], self.counters[port]
        if not link.up:
            counters["down_drops"] += 1
            return None
        if link.loss and self.rng.random() < link.loss:
            counters["lost"] += 1
            return None
        sent = now
        if link.rate_mbit > 0:
            start = max(now, free[port])
            if (start - now) * 1e3 > link.queue_ms:
                counters["queue_drops"] += 1
                return None
            sent = free[port] = start + (len(frame) + WIRE_OVERHEAD) * 8 / (link.rate_mbit * 1e6)
        arrival = sent + link.delay_ms / 1e3
        if link.jitter_ms:
            arrival += self.rng.uniform(0, link.jitter_ms) / 1e3
        arrival = last[port] = max(arrival, last[port])
        return arrival

    def receive(self, port: int) -> None:
        """Read every frame waiting on ``port``'s socket and schedule its arrival at the switch."""
        sock = self.sockets[port]
        for _ in range(256):  # bounded: the other ports and the timers get their turn
            try:
                frame, address = sock.recvfrom(65536)
            except BlockingIOError:
                return
            if address[2] == PACKET_OUTGOING:
                continue  # a frame we (or the hub's kernel) sent out of this port
            counters = self.counters[port]
            counters["rx"] += 1
            counters["rx_bytes"] += len(frame)
            if len(frame) > MAX_FRAME:
                counters["oversize"] += 1  # offloads left on: see disable_offloads
                continue
            if not frame[6] & 1:  # learn unicast source MACs only
                self.macs[frame[6:12]] = port
            arrival = self.cross(port, frame, time.monotonic(), self.up_free, self.up_last)
            if arrival is not None:
                self.push(arrival, 0, port, frame)

    def forward(self, source: int, frame: bytes, now: float) -> None:
        """``frame`` reached the switch from ``source``: queue it on its destination's downlink(s)."""
        destination = None if frame[0] & 1 else self.macs.get(frame[0:6])
        targets = [destination] if destination is not None else range(len(self.ports))
        for port in targets:
            if port == source:
                continue
            leaves = self.cross(port, frame, now, self.down_free, self.down_last)
            if leaves is not None:
                self.push(leaves, 1, port, frame)

    def send(self, port: int, frame: bytes, due: float, now: float) -> None:
        """Put ``frame`` on ``port`` (the host's end of the link) unless the link went down meanwhile."""
        counters = self.counters[port]
        if not self.links[port].up:
            counters["down_drops"] += 1
            return
        try:
            self.sockets[port].send(frame)
        except OSError:
            counters["send_errors"] += 1
            return
        counters["tx"] += 1
        counters["tx_bytes"] += len(frame)
        late = (now - due) * 1e3
        stats = self.lateness
        stats["n"] += 1
        stats["sum_ms"] += late
        stats["max_ms"] = max(stats["max_ms"], late)
        for limit in (1, 5, 20):
            if late > limit:
                stats[f"over_{limit}ms"] += 1

    def run(self) -> None:
        """Forward until SIGTERM/SIGINT; re-read the control file every 50 ms, write stats every second."""
        poller = select.poll()
        for sock in self.sockets:
            poller.register(sock, select.POLLIN)
        next_control = next_stats = 0.0
        while not self.stopping:
            now = time.monotonic()
            if now >= next_control:
                self.read_control()
                next_control = now + 0.05
            if now >= next_stats:
                self.write_stats()
                next_stats = now + 1.0
            wait = min(next_control, self.heap[0][0] if self.heap else next_control) - now
            for fd, _ in poller.poll(max(0, int(wait * 1e3 + 0.999))):
                self.receive(self.by_fd[fd])
            now = time.monotonic()
            while self.heap and self.heap[0][0] <= now:
                due, _, stage, port, frame = heapq.heappop(self.heap)
                if stage == 0:
                    self.forward(port, frame, due)
                else:
                    self.send(port, frame, due, now)
        self.write_stats()


# ------------------------------------------------------------------------------------------------
# the controller (runs in the caller's namespace)


class SwitchProcess:
    """Runs :class:`Switch` in the hub namespace ``hub`` over ``ports``; links are changed with :meth:`set`."""

    def __init__(self, hub: str, ports: list[str], workdir: Path, links: list[Link] | None = None, seed: int = 0):
        self.hub, self.ports, self.seed = hub, ports, seed
        workdir.mkdir(parents=True, exist_ok=True)
        self.control, self.stats_path = workdir / "switch-control.json", workdir / "switch-stats.json"
        self.links = links or [Link() for _ in ports]
        self.generation = 0
        self.process: subprocess.Popen | None = None
        self.log = workdir / "switch.log"

    def start(self, timeout: float = 30.0) -> SwitchProcess:
        """Start the switch and wait until it has applied the links."""
        self._write()
        command = [sys.executable, str(Path(__file__).resolve()), "--ports", *self.ports]
        command += ["--control", str(self.control), "--stats", str(self.stats_path), "--seed", str(self.seed)]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(["ip", "netns", "exec", self.hub, *command], stdout=log, stderr=log)
        self._wait_applied(timeout)
        return self

    def _write(self) -> None:
        data = {"generation": self.generation, "links": [dataclasses.asdict(link) for link in self.links]}
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.control)  # the switch never reads a half-written file

    def _wait_applied(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the switch exited ({self.process.returncode}): {self.log.read_text()[-2000:]}")
            if self.stats().get("generation") == self.generation:
                return
            time.sleep(0.02)
        raise RuntimeError(f"the switch did not apply link generation {self.generation} within {timeout} s")

    def set(self, port: int, timeout: float = 10.0, **changes: Any) -> None:
        """Change ``port``'s link (e.g. ``up=False`` cuts the host off) and wait until the switch applied it."""
        self.set_links({port: dataclasses.replace(self.links[port], **changes)}, timeout)

    def set_links(self, links: dict[int, Link], timeout: float = 10.0) -> None:
        """Replace the links of the ports given and wait until the switch applied them."""
        for port, link in links.items():
            self.links[port] = link
        self.generation += 1
        self._write()
        self._wait_applied(timeout)

    def stats(self) -> dict[str, Any]:
        """The switch's last stats file: per-port counters, lateness, CPU seconds ({} before the first)."""
        try:
            return json.loads(self.stats_path.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        """Stop the switch (SIGTERM, then SIGKILL after 10 s); safe to call twice."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # `ip netns exec` execs the switch: this is the switch's own PID
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def main() -> None:
    """Run the switch, or with ``--offloads-off`` turn off a device's offloads."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ports", nargs="*", default=[], help="hub-side veth ports to switch between")
    parser.add_argument("--control", type=Path, help="JSON control file (links and generation)")
    parser.add_argument("--stats", type=Path, help="JSON stats file the switch writes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the loss and jitter draws")
    parser.add_argument("--offloads-off", nargs="*", default=[], metavar="DEV", help="only turn off DEV's offloads")
    args = parser.parse_args()
    if args.offloads_off:
        for dev in args.offloads_off:
            disable_offloads(dev)
        return
    # A frame waits for the switch's turn on a CPU as well as for its link: on a busy machine that lateness (and the
    # bursts it compresses into the bandwidth queues) is an artefact, so the switch asks for a higher priority. It
    # uses a few % of a core, so the other processes lose little.
    with contextlib.suppress(OSError):
        os.nice(-10)
    switch = Switch(args.ports, args.control, args.stats, args.seed)

    def stop(*_: Any) -> None:
        switch.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    switch.run()


if __name__ == "__main__":
    main()
