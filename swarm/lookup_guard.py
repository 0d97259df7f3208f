"""Bounds how often one DHT lookup of this node asks one libp2p peer, whatever the answers it gets name.

hivemind's lookup (``DHTNode.get_many_by_id`` and ``traverse_dht``) walks by node ids: every find answer names the
key's nearest neighbours as (node id, libp2p peer id) pairs, taken as given, and the lookup asks every node id it has
not asked yet that lies nearer the key than those it keeps. A hostile node answering with made-up ids nearer the key
than any before, all mapped to its own libp2p peer id (or to an honest peer's, amplifying onto that peer), and with a
value dated too old to end the lookup, was asked again and again until the lookup's timeout: on 127.0.0.1, 4303 times
in one 20 s index read, the reader's event loop busy 14.7 s of it checking the 64 signed entries of each answer
(``python -m testbed.lookup_attack``).

One libp2p peer holds one node id in this node's routing table (:class:`swarm.ping_gate.RoutingGuard`); the neighbours
of an answer are held to the same rule (:func:`one_id_per_peer`, applied to every find answer by
:func:`swarm.hivemind_bridge.bound_find_answers`): the answering peer naming itself is dropped (an honest node never
does: its routing table does not hold it), and so is this node (a lookup reads its own storage first, and hivemind's
store asserts that this node is none of the nearest nodes a search found: another peer named under this node's id,
which hivemind took as given, failed its stores), a peer is kept once per answer, and a peer
this node knows goes under the node id it knows it by, which a lookup that asked it already has visited. So within
one lookup a peer is asked once under each id it is known by, about once, whatever ids the answers name for it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import TypeVar

NodeId = TypeVar("NodeId")
Peer = TypeVar("Peer")


def one_id_per_peer(
    neighbours: Iterable[tuple[NodeId, Peer]],
    known: Callable[[Peer], NodeId | None],
    dropped: Collection[Peer],
    dropped_ids: Collection[NodeId] = (),
) -> tuple[list[tuple[NodeId, Peer]], int]:
    """The neighbours an answer named (nearest first) that a lookup may ask, and how many of them were ignored or
    renamed: a peer of ``dropped`` (the answerer, this node) goes, each other peer is kept once (under the first id
    named for it), a peer ``known`` maps to an id goes under that id, and a neighbour whose id is then one of
    ``dropped_ids`` (this node's) goes."""
    kept: list[tuple[NodeId, Peer]] = []
    named: set[Peer] = set()
    ignored = 0
    for node_id, peer in neighbours:
        if peer in dropped or peer in named:
            ignored += 1
            continue
        named.add(peer)
        known_id = known(peer)
        if known_id is not None and known_id != node_id:
            ignored += 1
            node_id = known_id
        if node_id in dropped_ids:
            ignored += 1
            continue
        kept.append((node_id, peer))
    return kept, ignored
