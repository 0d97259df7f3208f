"""Hosts made with Linux network namespaces: a switch in a hub namespace, one namespace per host, veth links.

The switch is the kernel's bridge, or with ``userspace=True`` a :mod:`testbed.wan_switch` process that gives every
host's link its own delay, loss, bandwidth and up/down state (this kernel has no ``netem``). Needs root (or
CAP_NET_ADMIN) and iproute2. Addresses are 10.231.0.0/24 inside the namespaces only, with no route out, so nothing
a test starts there can reach another machine.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from testbed.wan_switch import Link, SwitchProcess

SUBNET = "10.231.0"
SWITCH = Path(__file__).resolve().parent / "wan_switch.py"
CLONE_NEWNET = 0x40000000

T = TypeVar("T")


def in_namespace(ns: str, make: Callable[[], T]) -> T:
    """``make()`` called in a new thread that entered the network namespace ``ns`` (made by ``ip netns add``), its
    result returned (its exception raised). What that thread starts stays in ``ns`` (Linux gives a new thread, and a
    child process such as p2pd, the namespaces of the thread that starts it), while the test's own threads stay where
    they are: one test process can run peers on several hosts, talking to their daemons over Unix sockets, which do
    not belong to a network namespace."""
    result: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns}")
            finally:
                os.close(fd)
            result.append(make())
        except BaseException as e:  # handed to the caller
            errors.append(e)

    thread = threading.Thread(target=run, name=f"netns-{ns}")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


class Hosts:
    """A switch in a hub namespace and one namespace per host, each linked to the switch by a veth pair."""

    def __init__(self, count: int, userspace: bool = False):
        tag = f"sapo{os.getpid() % 100000}"
        self.hub = f"{tag}hub"
        self.names = [f"{tag}h{i}" for i in range(count)]
        self.userspace = userspace
        self.created: list[str] = []
        self.switch: SwitchProcess | None = None

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)

    def create(self) -> None:
        """Make the namespaces and links (and the kernel bridge unless ``userspace``); see :meth:`start_switch`."""
        for ns in (self.hub, *self.names):
            self.ip("netns", "add", ns)
            self.created.append(ns)
            self.ip("-n", ns, "link", "set", "lo", "up")
        if not self.userspace:
            self.ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            self.ip("-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            self.ip("link", "add", f"port{i}", "netns", self.hub, "type", "veth", "peer", "name", "eth0", "netns", ns)
            if self.userspace:
                # the switch re-sends frames as they are: hosts must send complete, MTU-sized frames
                self._offloads_off(ns, "eth0")
                self.ip("-n", self.hub, "link", "set", f"port{i}", "promisc", "on")
            else:
                self.ip("-n", self.hub, "link", "set", f"port{i}", "master", "br0")
            self.ip("-n", self.hub, "link", "set", f"port{i}", "up")
            self.ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")
        if self.userspace:
            self._offloads_off(self.hub, *self.ports())

    def _offloads_off(self, ns: str, *devices: str) -> None:
        command = ["netns", "exec", ns, sys.executable, str(SWITCH), "--offloads-off", *devices]
        self.ip(*command)

    def ports(self) -> list[str]:
        """The hub-side veth ends, one per host."""
        return [f"port{i}" for i in range(len(self.names))]

    def start_switch(self, workdir: Path, links: list[Link] | None = None, seed: int = 0) -> SwitchProcess:
        """Start the userspace switch (``userspace=True`` only) with ``links`` (default: perfect links)."""
        assert self.userspace, "the kernel bridge needs no switch process"
        self.switch = SwitchProcess(self.hub, self.ports(), workdir, links, seed).start()
        return self.switch

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def set_link(self, i: int, up: bool) -> None:
        """Cut (or restore) host ``i``'s cable: its switch port goes down (up)."""
        if self.switch is not None:
            self.switch.set(i, up=up)
        else:
            self.ip("-n", self.hub, "link", "set", f"port{i}", "up" if up else "down")

    def remove(self) -> None:
        """Stop the switch and delete every namespace made (their veths go with them)."""
        try:
            if self.switch is not None:
                self.switch.stop()
        finally:
            for ns in reversed(self.created):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
