"""Rejoining after a partition: remember how to reach the peers connected, and join through them once none is left.

hivemind drops a neighbour that stops answering and never looks again, so after a partition (the network down, every
neighbour gone) a peer would stay alone for good. :class:`Rejoin` keeps the addresses of the peers connected, pings the
neighbours listed when none of them is connected (so that those gone are dropped), and, while the routing table is
empty, dials and pings the peers it knew, backing off between failed attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.hivemind_bridge import connect
from swarm.transport import SwarmCounters

logger = logging.getLogger(__name__)

KNOWN_PEERS_KEPT = 64
"""Addresses remembered for rejoining; the oldest go first."""

NEIGHBOURS_PINGED = 8
"""Neighbours pinged at most per check when none of them is connected."""


class Rejoin:
    """The peers a DHT peer knows how to reach, and its attempts to rejoin through them (counted as
    ``rejoin_attempts`` and ``rejoins``), every ``rejoin_interval`` seconds at first, twice as long after each failed
    attempt up to ``rejoin_max_interval``.

    Args:
        config: the transport's settings (``rejoin_interval``, ``rejoin_max_interval``, ``wait_timeout``,
            ``fetch_timeout``).
        counters: where attempts and rejoins are counted.
        clock: monotonic time, for the backoff.
        label: the peer's name in log lines.
    """

    def __init__(
        self, config: DHTTransportConfig, counters: SwarmCounters, clock: Clock = SYSTEM_CLOCK, label: str = ""
    ):
        self.config = config
        self._counters = counters
        self._clock = clock
        self._label = label
        self._known_peers: dict[Any, list[Any]] = {}  # libp2p PeerID -> multiaddrs
        self._alone_since: float | None = None
        self._rejoin_wait = config.rejoin_interval  # backoff between failed attempts, doubled up to the cap
        self._next_rejoin = 0.0

    def remember_addresses(self, addresses: Iterable[str]) -> None:
        """Remember full multiaddrs (``.../p2p/<peer id>``: the initial and rejoin peers) to rejoin through."""
        for addr in addresses:
            maddr = Multiaddr(addr)
            self._known_peers[PeerID.from_base58(maddr["p2p"])] = [maddr.decapsulate(Multiaddr(f"/p2p/{maddr['p2p']}"))]

    async def keep(self, p2p: P2P | None, node: DHTNode) -> None:
        """Remember how to reach the peers connected now; drop neighbours that left; rejoin through the peers known
        once none is left."""
        assert p2p is not None
        connected = await asyncio.wait_for(p2p.list_peers(), self.config.wait_timeout)
        for info in connected:
            if info.addrs:
                self._known_peers[info.peer_id] = list(info.addrs)
        while len(self._known_peers) > KNOWN_PEERS_KEPT:
            self._known_peers.pop(next(iter(self._known_peers)))
        await self._ping_if_none_connected(node, {info.peer_id for info in connected})
        if node.protocol.routing_table.peer_id_to_uid or not self._known_peers:
            self._not_alone()
            return
        now = self._clock.monotonic()
        if now < self._next_rejoin:  # backing off after failed attempts
            return
        self._counters.add("rejoin_attempts")
        if self._alone_since is None:  # warn once per partition, not at every attempt
            self._alone_since = now
            logger.warning(
                "peer %s has no DHT neighbour (network down, every neighbour left, or no initial peer answered); "
                "trying to join through %d known peer(s), every %g s at first, backing off to every %g s",
                self._label, len(self._known_peers), self.config.rejoin_interval, self.config.rejoin_max_interval,
            )  # fmt: skip
        if await self._dial_known(p2p, node):
            await asyncio.wait_for(node.find_nearest_nodes([node.node_id]), self.config.fetch_timeout)
            self._counters.add("rejoins")
            neighbours = len(node.protocol.routing_table.peer_id_to_uid)
            alone = self._clock.monotonic() - (self._alone_since or self._clock.monotonic())
            logger.info(
                "peer %s rejoined the swarm after %.0f s alone (%d neighbour(s))", self._label, alone, neighbours
            )
            self._not_alone()
        else:
            self._next_rejoin = now + self._rejoin_wait
            self._rejoin_wait = min(
                2 * self._rejoin_wait, max(self.config.rejoin_max_interval, self.config.rejoin_interval)
            )

    def _not_alone(self) -> None:
        """Forget the partition and its backoff: the next one starts at ``rejoin_interval`` again."""
        self._alone_since = None
        self._rejoin_wait, self._next_rejoin = self.config.rejoin_interval, 0.0

    async def _ping_if_none_connected(self, node: DHTNode, connected: set[Any]) -> None:
        """When none of the neighbours the routing table lists is connected, ping them (at most
        :data:`NEIGHBOURS_PINGED`): hivemind drops a neighbour only when a request to it fails, so one that left would
        be listed until this peer's next store, and a peer whose every neighbour left would not know it is alone."""
        listed = list(node.protocol.routing_table.peer_id_to_uid)
        if not listed or connected.intersection(listed):
            return
        await asyncio.gather(*(node.protocol.call_ping(peer) for peer in listed[:NEIGHBOURS_PINGED]))
        await asyncio.sleep(0)  # the routing table is updated by a task each ping starts

    async def _dial_known(self, p2p: P2P, node: DHTNode) -> bool:
        """Dial and ping every known peer at once; whether one answered as a DHT node."""

        async def dial_and_ping(peer_id: Any, addrs: list[Any]) -> Any:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connect(p2p, peer_id, addrs), self.config.wait_timeout)
            return await node.protocol.call_ping(peer_id)

        answers = await asyncio.gather(
            *(dial_and_ping(peer_id, addrs) for peer_id, addrs in self._known_peers.items()), return_exceptions=True
        )
        return any(isinstance(answer, DHTID) for answer in answers)
