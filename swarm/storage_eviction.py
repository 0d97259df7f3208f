"""What a full DHT storage evicts: from the host whose stores hold the most, the peer of that host whose stores hold
the most loses its value that expires first, again and again.

Each stored value is counted to its storer, ``(host, peer)``: the host (:func:`swarm.peer_hosts.host_of_ip`) and the
libp2p peer of the store request that brought it. Peers are free (a key each), hosts are not: counting hosts first
makes a machine that stores under many identities lose its own values before another host's, however it spreads them
over its identities. Peers of one host (a swarm on one machine, peers behind one NAT) are weighed against each other
as before, by what each holds. The peers whose host is not known are one host together (identities that keep their
connections out of the daemon's listing gain nothing by it); values with no storer (this node's own stores, a lookup's
cached results, what was held before the count began) are one group.

One key's dictionary (an index shard: one subkey a peer) is bounded in subkeys by the same rule
(:func:`trim_subkeys`), so that a host storing entries of thousands of identities under one key loses its own before
the key's answer grows past what a reader takes. There the peers of this machine (loopback) are each a host of their
own (:func:`key_group`), as the store budget counts them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from typing import Any

from swarm.peer_hosts import is_this_machine

__all__ = ["Storer", "Unit", "evict_by_host_then_peer", "host_group", "key_group", "trim_subkeys"]

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


def key_group(storer: Storer | None) -> Hashable:
    """The group a subkey of ``storer`` is counted in first within one key's dictionary (:func:`trim_subkeys`): as
    :func:`host_group`, except that a peer of this machine (loopback: a swarm run on one machine) is a group of its
    own, as the store budget counts it (its peers keep their own budgets)."""
    host, peer = storer or _NO_ONE
    if host is not None and is_this_machine(host):
        return ("this machine", peer)
    return host_group(storer)


def trim_subkeys(
    expirations: dict[Any, float],
    storer_of: Callable[[Any], Storer | None],
    max_subkeys: int,
    remove: Callable[[Any], None],
) -> int:
    """Bound one key's dictionary: when its subkeys (``expirations``: each one's expiration time) number more than
    ``max_subkeys``, ``remove`` subkeys until at most 7/8 of ``max_subkeys`` (at least one) are left, so that the next
    trim is at least an eighth of the bound away: each time from the group (:func:`key_group`) holding the most subkeys
    of the key, of it the storer holding the most, its subkey that expires first. Returns the subkeys removed. So a
    host holding fewer of the key's subkeys than another keeps them all while that one trims."""
    held = len(expirations)
    if held <= max_subkeys:
        return 0
    keep = max(1, max_subkeys * 7 // 8)
    units: dict[Unit, tuple[int, float]] = {(None, subkey): (1, when) for subkey, when in expirations.items()}
    return evict_by_host_then_peer(
        units,
        lambda unit: storer_of(unit[1]),
        lambda unit: 1,
        lambda gone: held - gone <= keep,
        lambda unit: remove(unit[1]),
        group=key_group,
    )


def subkeys_that_fit(sizes: dict[Any, int], storer_of: Callable[[Any], Storer | None], room: int) -> list[Any]:
    """The subkeys of one key's dictionary (``sizes``: each one's bytes in an answer) to answer with when they do not
    all fit in ``room`` bytes: those of the group (:func:`key_group`) holding the fewest of the key's bytes first, of a
    group the smallest first, as many as fit. So subkeys a host stores by the megabyte under another peer's records
    key push out its own, not the owner's (the holder cannot tell the owner: it sees the key's hash)."""
    group_of = {subkey: key_group(storer_of(subkey)) for subkey in sizes}
    held: dict[Hashable, int] = {}
    for subkey, size in sizes.items():
        held[group_of[subkey]] = held.get(group_of[subkey], 0) + size
    order = sorted(sizes, key=lambda subkey: (held[group_of[subkey]], sizes[subkey]))
    chosen, used = [], 0
    for subkey in order:
        if used + sizes[subkey] > room:
            break
        chosen.append(subkey)
        used += sizes[subkey]
    return chosen


def evict_by_host_then_peer(
    units: dict[Unit, tuple[int, float]],
    storer_of: Callable[[Unit], Storer | None],
    size: Callable[[Unit], int],
    enough: Callable[[int], bool],
    remove: Callable[[Unit], None],
    group: Callable[[Storer], Hashable] = host_group,
) -> int:
    """Until ``enough(bytes evicted)``: of ``units`` (each value's bytes and expiration time), take the host group whose
    values sum to the most ``size`` (``group``: the group of a storer, :func:`host_group`), within it the storer whose
    values do, and ``remove`` that storer's value that expires first. Returns the bytes evicted."""
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
        named = group(storer)
        host_sums[named] = host_sums.get(named, 0) + total
        peers_of.setdefault(named, []).append((-total, n, storer))
    for peers in peers_of.values():
        heapq.heapify(peers)
    largest = [(-total, n, named) for n, (named, total) in enumerate(host_sums.items())]
    heapq.heapify(largest)
    gone = 0
    while largest and not enough(gone):
        _, n, named = heapq.heappop(largest)
        peers = peers_of[named]
        _, m, storer = heapq.heappop(peers)
        _, unit = queues[storer].pop()
        remove(unit)
        gone += units[unit][0]
        peer_sums[storer] -= size(unit)
        host_sums[named] -= size(unit)
        if queues[storer]:
            heapq.heappush(peers, (-peer_sums[storer], m, storer))
        if peers:
            heapq.heappush(largest, (-host_sums[named], n, named))
    return gone
