"""The userspace WAN switch between two namespace hosts applies its links' delay, loss, bandwidth and cuts.

UDP probes from host 0 to an echo server on host 1 (no ping here): the round trip takes at least
``2 * (delay_0 + delay_1)``, a lossy link loses about the share of probes it should, a cut link passes nothing and
a restored one passes again, and a bandwidth limit spreads a burst over at least its serialisation time. Tolerances
are wide: the machine is shared, so only lower bounds on time are asserted. Needs root (or CAP_NET_ADMIN) and
iproute2; skipped with the reason where namespaces cannot be made.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.netns import Hosts
from testbed.wan_switch import WIRE_OVERHEAD, Link

ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9000))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(65536)
    s.sendto(data, peer)
"""

# Sends `count` probes of `size` bytes `gap` seconds apart, collects echoes until `wait` s after the last; prints
# the round trips (s) of the probes that came back and the time from the first send to the last echo.
PROBE = """
import json, socket, sys, time
host, count, size, gap, wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
sent, rtts, last = {}, [], None
start = time.monotonic()
for i in range(count):
    sent[i] = time.monotonic()
    s.sendto(i.to_bytes(4, "big") * (size // 4), (host, 9000))
    time.sleep(gap)
end = time.monotonic() + wait
while time.monotonic() < end:
    s.settimeout(max(0.01, end - time.monotonic()))
    try:
        data = s.recv(65536)
    except TimeoutError:
        break
    last = time.monotonic()
    rtts.append(last - sent[int.from_bytes(data[:4], "big")])
print(json.dumps({"rtts": rtts, "span": None if last is None else last - start}))
"""


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (the ip command) is not installed")
    made = Hosts(2, userspace=True)
    try:
        made.create()
    except subprocess.CalledProcessError as e:
        made.remove()
        pytest.skip(f"cannot create network namespaces here (needs root or CAP_NET_ADMIN): {e.stderr.strip()}")
    echo = None
    try:
        made.start_switch(tmp_path, [Link(delay_ms=20), Link(delay_ms=30)])
        echo = subprocess.Popen(
            ["ip", "netns", "exec", made.names[1], sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True
        )
        assert echo.stdout.readline().strip() == "ready"
        yield made
    finally:
        if echo is not None:
            echo.kill()  # `ip netns exec` execs Python: this is the echo server's own PID
            echo.wait(timeout=10)
        made.remove()


def probe(hosts: Hosts, count: int, size: int = 64, gap: float = 0.005, wait: float = 1.5) -> dict:
    """Probe host 1's echo server from host 0: ``{"rtts": [...], "span": s}``."""
    args = [hosts.address(1), str(count), str(size), str(gap), str(wait)]
    command = ["ip", "netns", "exec", hosts.names[0], sys.executable, "-c", PROBE, *args]
    return json.loads(subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout)


def test_the_switch_delays_loses_limits_cuts_and_restores(hosts: Hosts) -> None:
    switch = hosts.switch
    probe(hosts, 3)  # ARP first: its broadcast round trip would count in the first probe
    rtts = probe(hosts, 20, gap=0.02)["rtts"]
    assert len(rtts) == 20
    assert min(rtts) >= 2 * (0.020 + 0.030) - 0.002  # each direction crosses both links
    assert sorted(rtts)[10] < 1.0  # and not absurdly more (the machine is shared: a wide bound)

    # 30 % loss on host 1's link, each direction: an echo survives with probability 0.7 ** 2 = 0.49
    switch.set(1, loss=0.3)
    survived = len(probe(hosts, 300, gap=0.002)["rtts"]) / 300
    assert 0.3 < survived < 0.7
    switch.set(1, loss=0.0)

    # a cut link passes nothing; restored, it passes everything again
    hosts.set_link(1, up=False)
    assert probe(hosts, 20, wait=0.5)["rtts"] == []
    hosts.set_link(1, up=True)
    assert len(probe(hosts, 20)["rtts"]) == 20

    # 1 Mbit/s on host 0's link: a burst of 40 frames of 1000 bytes takes at least their serialisation time
    switch.set(0, rate_mbit=1.0, queue_ms=2000)
    burst = probe(hosts, 40, size=1000, gap=0.0, wait=3.0)
    wire_bits = 40 * (1000 + 8 + 20 + 14 + WIRE_OVERHEAD) * 8  # UDP, IP and Ethernet headers
    assert len(burst["rtts"]) == 40
    assert burst["span"] >= wire_bits / 1e6

    ports = switch.stats()["ports"]
    assert all(counters["oversize"] == 0 for counters in ports.values())
    assert ports["port1"]["lost"] > 0 and ports["port1"]["down_drops"] > 0
