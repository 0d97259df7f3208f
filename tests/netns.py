"""Hosts made with Linux network namespaces: a bridge in a hub namespace, one namespace per host, veth links.

Needs root (or CAP_NET_ADMIN) and iproute2. Addresses are 10.231.0.0/24 inside the namespaces only, with no
route out, so nothing a test starts there can reach another machine.
"""

from __future__ import annotations

import os
import subprocess

SUBNET = "10.231.0"


class Hosts:
    """A bridge in a hub namespace and one namespace per host, each linked to the bridge by a veth pair."""

    def __init__(self, count: int):
        tag = f"sapo{os.getpid() % 100000}"
        self.hub = f"{tag}hub"
        self.names = [f"{tag}h{i}" for i in range(count)]
        self.created: list[str] = []

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)

    def create(self) -> None:
        for ns in (self.hub, *self.names):
            self.ip("netns", "add", ns)
            self.created.append(ns)
            self.ip("-n", ns, "link", "set", "lo", "up")
        self.ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            self.ip("link", "add", f"port{i}", "netns", self.hub, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.ip("-n", self.hub, "link", "set", f"port{i}", "master", "br0")
            self.ip("-n", self.hub, "link", "set", f"port{i}", "up")
            self.ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def set_link(self, i: int, up: bool) -> None:
        """Cut (or restore) host ``i``'s cable: its bridge port goes down (up)."""
        self.ip("-n", self.hub, "link", "set", f"port{i}", "up" if up else "down")

    def remove(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
