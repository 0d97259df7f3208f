"""What a full DHT storage evicts: from the host whose stores hold the most, the peer of that host whose stores hold
the most loses its value that expires first, again and again.

Each stored value is counted to its storer, ``(host, peer)``: the host (:func:`swarm.peer_hosts.host_of_ip`) and the
libp2p peer of the store request that brought it. Peers are free (a key each), hosts are not: counting hosts first
makes a machine that stores under many identities lose its own values before another host's, however it spreads them
over its identities. Peers of one host (a swarm on one machine, peers behind one NAT) are weighed against each other
as before, by what each holds. The peers whose host is not known are one host together (identities that keep their
connections out of the daemon's listing gain nothing by it); values with no storer (this node's own stores, a lookup's
cached results, what was held before the count began) are one group.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Storer", "Unit", "evict_by_host_then_peer", "host_group"]

Unit = tuple[Any, Any]
"""A stored value: ``(key, subkey)``, the subkey None for a key's own value."""

Storer = tuple[str | None, str | None]
"""Who stored a value: ``(host, libp2p peer id)``; ``(None, None)`` for no one (this node, a lookup)."""

_NO_ONE: Storer = (None, None)


def host_group(storer: Storer | None) -> Hashable:
    """The group a value of ``storer`` is counted in first: its host; the peers of unknown host share one (no storer:
    one group of its own)."""
    host, peer = storer or _NO_ONE
    if host is not None:
        return ("host", host)
    return ("unlisted",) if peer is not None else ("no one",)


def evict_by_host_then_peer(
    units: dict[Unit, tuple[int, float]],
    storer_of: Callable[[Unit], Storer | None],
    size: Callable[[Unit], int],
    enough: Callable[[int], bool],
    remove: Callable[[Unit], None],
) -> int:
    """Until ``enough(bytes evicted)``: of ``units`` (each value's bytes and expiration time), take the host group whose
    values sum to the most ``size``, within it the storer whose values do, and ``remove`` that storer's value that
    expires first. Returns the bytes evicted."""
    queues: dict[Storer, list[tuple[float, Unit]]] = {}
    peer_sums: dict[Storer, int] = {}
    for unit, (_, expiration_time) in units.items():
        storer = storer_of(unit) or _NO_ONE
        queues.setdefault(storer, []).append((expiration_time, unit))
        peer_sums[storer] = peer_sums.get(storer, 0) + size(unit)
    for queue in queues.values():
        queue.sort(key=lambda entry: entry[0], reverse=True)  # the one that expires first at the end
    host_sums: dict[Hashable, int] = {}
    peers_of: dict[Hashable, list[tuple[int, int, Storer]]] = {}  # a max-heap of each host's storers
    for n, (storer, total) in enumerate(peer_sums.items()):
        group = host_group(storer)
        host_sums[group] = host_sums.get(group, 0) + total
        peers_of.setdefault(group, []).append((-total, n, storer))
    for peers in peers_of.values():
        heapq.heapify(peers)
    largest = [(-total, n, group) for n, (group, total) in enumerate(host_sums.items())]
    heapq.heapify(largest)
    gone = 0
    while largest and not enough(gone):
        _, n, group = heapq.heappop(largest)
        peers = peers_of[group]
        _, m, storer = heapq.heappop(peers)
        _, unit = queues[storer].pop()
        remove(unit)
        gone += units[unit][0]
        peer_sums[storer] -= size(unit)
        host_sums[group] -= size(unit)
        if queues[storer]:
            heapq.heappush(peers, (-peer_sums[storer], m, storer))
        if peers:
            heapq.heappush(largest, (-host_sums[group], n, group))
    return gone
