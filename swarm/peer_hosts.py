"""Which host a libp2p peer connects from: the network address of its connection, as this node's daemon observed it.

A libp2p identity costs one key, so a bound per identity (a store budget, a share of the DHT storage) bounds nothing
for a machine that makes identities by the hundred. Its address costs more: :func:`host_of_ip` names the host of an
address (an IPv4 address whole, an IPv6 address by its /64), and :class:`PeerHosts` finds it for a connected peer
with hivemind's public ``P2P.list_peers()`` (one entry per connection, its address the remote end's as the daemon
sees it, as :func:`swarm.reachability.observed_ip` reads it), keeping what it found for a short while, in a bounded
book, so that a store request does not cost a daemon round trip each time.

Peers behind one NAT, or reaching this node through one relay, share a host: what is counted per host is shared by
them too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from swarm.reachability import observed_ip

__all__ = ["PeerHosts", "host_of_ip", "is_this_machine"]


def host_of_ip(ip: str) -> str | None:
    """The host an address belongs to: an IPv4 address itself, an IPv6 address its /64 network (``"2001:db8::/64"``);
    an IPv4 address written as IPv6 (``::ffff:a.b.c.d``) is the IPv4 one, ``::1`` itself. None when ``ip`` is no
    address."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        if address.is_loopback:
            return str(address)  # ::1, this machine
        # A host is given a whole /64 (SLAAC, a provider's delegation to one line): it takes any address within it
        # for free, so every address of the /64 is one host's. (Per address, one machine would be 2**64 hosts.)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def is_this_machine(host: str) -> bool:
    """Whether ``host`` (:func:`host_of_ip`) is a loopback address: peers of this very machine (a swarm run on one)."""
    try:
        return ipaddress.ip_network(host).is_loopback
    except ValueError:
        return False


UNLISTED_SECONDS = 1.0
"""How long a peer the daemon lists no address for is booked as hostless before it is looked up again."""

LISTING_INTERVAL = 0.5
"""The least seconds between the beginnings of two listings: new identities that a listing under way missed wait for
the next one together instead of each beginning its own (one machine dialing fresh keys would otherwise make the node
list every connection once per key)."""


class PeerHosts:
    """The host (:func:`host_of_ip`) each connected libp2p peer connects from, looked up in the daemon's connections.

    Args:
        list_peers: hivemind's ``P2P.list_peers`` (awaitable; ``PeerInfo`` with ``peer_id`` and ``addrs``).
        ttl: seconds a peer's host is kept before it is looked up again.
        max_peers: the most peers the book holds (the ones found longest ago leave first).
        clock: monotonic seconds (tests pass their own).
        min_interval: the least seconds between the beginnings of two listings (:data:`LISTING_INTERVAL`).

    A peer not in the book is looked up in a listing of the daemon's connections (one ``list_peers`` call, which also
    books every other connected peer): the one under way, and if that one missed it, the first begun after its
    request arrived, which waits until ``min_interval`` after the last one began. So however many identities connect,
    the node lists its connections at most once per ``min_interval``, and a new peer's first request waits up to that
    long for its host. A peer the daemon lists no address for has no host (None), booked so for
    :data:`UNLISTED_SECONDS` only.
    """

    def __init__(
        self,
        list_peers: Callable[[], Awaitable[Sequence[Any]]],
        ttl: float = 60.0,
        max_peers: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        min_interval: float = LISTING_INTERVAL,
    ):
        self._list_peers = list_peers
        self.ttl = ttl
        self.max_peers = max_peers
        self.min_interval = min_interval
        self._clock = clock
        self._book: dict[str, tuple[str | None, float]] = {}  # peer id (base58) -> (host, when found), oldest first
        self._listing: asyncio.Future[dict[str, str | None]] | None = None
        self._listing_began = -float("inf")  # when the latest listing began (or, waiting, will)
        self.lookups = 0  # list_peers calls made

    def __len__(self) -> int:
        """How many peers the book holds."""
        return len(self._book)

    async def host(self, peer_id: Any) -> str | None:
        """The host ``peer_id`` (a libp2p ``PeerID``) connects from; None if the daemon lists no address for it."""
        key = peer_id.to_base58()
        found = self._fresh(key)
        if found is not None:
            return found[0]
        arrived = self._clock()
        try:
            hosts: dict[str, str | None] = {}
            if self._listing is not None and not self._listing.done():
                hosts = await asyncio.shield(self._listing)
            if key not in hosts:  # none under way, or the one joined began before this peer connected
                hosts = await self._listed_after(arrived)
        except Exception:  # the daemon did not answer: no host now, looked up again next time
            return None
        host = hosts.get(key)
        self._book.pop(key, None)  # booked last, so that the bound keeps it
        # a peer not listed (its connection closed as its request arrived, say) is booked as hostless only briefly:
        # its next requests, once it is listed again, count to its host
        when = self._clock() if host is not None else self._clock() - self.ttl + UNLISTED_SECONDS
        self._book[key] = (host, when)
        self._trim()
        return host

    async def _listed_after(self, arrived: float) -> dict[str, str | None]:
        """The hosts of a listing begun after ``arrived``: the latest if it did (under way, waiting or done), else a
        new one, begun ``min_interval`` after the latest began (at once if that is past), which the lookups arriving
        before it begins join."""
        if self._listing is None or self._listing_began <= arrived:
            delay = max(0.0, self._listing_began + self.min_interval - self._clock())
            self._listing_began = self._clock() + delay
            self._listing = asyncio.ensure_future(self._list(delay))
        return await asyncio.shield(self._listing)

    def _fresh(self, key: str) -> tuple[str | None, float] | None:
        found = self._book.get(key)
        if found is not None and self._clock() - found[1] > self.ttl:
            del self._book[key]
            return None
        return found

    async def _list(self, delay: float = 0.0) -> dict[str, str | None]:
        """After ``delay`` seconds, book the host of every connected peer the daemon lists; returns them by peer id."""
        if delay > 0:
            await asyncio.sleep(delay)
        self.lookups += 1
        infos = await self._list_peers()
        now, hosts = self._clock(), {}
        for info in infos:
            key = info.peer_id.to_base58()
            ip = observed_ip(info.addrs)
            if key in hosts or ip is None:  # one entry per connection: the first with an address counts
                continue
            hosts[key] = host_of_ip(ip)
            self._book.pop(key, None)
            self._book[key] = (hosts[key], now)
        self._trim()
        return hosts

    def _trim(self) -> None:
        while len(self._book) > self.max_peers:
            del self._book[next(iter(self._book))]
