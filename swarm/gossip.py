"""This peer's announcement topics on GossipSub: stay subscribed to the right ones, hand what arrives to the reader,
publish this peer's announcements, and connect to the peers of its topic so that the topic's mesh forms.

Which topics (:mod:`swarm.levels`): a peer subscribes to its home topic at the topic level its estimate of N gives
(``subscribe_topics`` of them) and publishes on its home topics one level below, at and above it. When the level
changes (the estimate crossed a boundary), the new topics are joined before the old ones are left.

GossipSub meshes only peers that are connected, and p2pd has no discovery of topic peers: this peer dials the
libp2p hosts of the peers its reader knows to share a topic it listens to (from announcements and the index reads, which
go over the topic's index shards), a few per round, so that the topic's mesh forms at any swarm size.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

from swarm.config import DHTTransportConfig
from swarm.hivemind_bridge import connect
from swarm.levels import home_topic_shard, publish_topics, subscribe_topics
from swarm.pubsub import Subscription, publish, subscribe
from swarm.transport import SwarmCounters

logger = logging.getLogger(__name__)

_DIALS_PER_ROUND = 4  # topic peers this peer dials per round at most
GOSSIP_ROUND_SECONDS = 5.0
"""Seconds between two rounds of :meth:`Gossip.keep` (subscriptions checked, topic peers dialled)."""


class Gossip:
    """This peer's subscriptions and announcements (runs on the peer's event loop).

    Args:
        config: the swarm's name and the topic settings.
        p2p: returns the running peer's :class:`~swarm.hivemind_bridge.PubsubP2P`.
        peer: this peer's id (its home topics are hashes of it).
        topic_level: returns the topic level this peer's estimate of N gives (the reader's).
        on_announcement: called with ``(data, publisher's libp2p id)`` for every message of a subscribed topic.
        topic_hosts: returns the libp2p hosts of the peers known to share a topic this peer listens to at a level.
        counters: where announcements sent, failures and dials are counted.
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        p2p: Callable[[], Any],
        peer: str,
        topic_level: Callable[[], int],
        on_announcement: Callable[[bytes, str], Any],
        topic_hosts: Callable[[int], list[str]],
        counters: SwarmCounters,
    ):
        self.config = config
        self._p2p = p2p
        self._peer = peer
        self._topic_level = topic_level
        self._on_announcement = on_announcement
        self._topic_hosts = topic_hosts
        self._counters = counters
        self._subscriptions: dict[str, tuple[Subscription, asyncio.Task]] = {}
        self.level: int | None = None

    def topics(self) -> list[str]:
        """The topics this peer is subscribed to now."""
        return list(self._subscriptions)

    async def keep(self, node: Any = None) -> None:
        """One round: subscribe to this level's topics (leaving those of a former level), dial topic peers."""
        level = self._topic_level()
        wanted = subscribe_topics(self._peer, level, self.config)
        for topic in wanted:
            if topic not in self._subscriptions:
                subscription = await subscribe(self._p2p(), topic)
                task = asyncio.ensure_future(self._read(subscription))
                self._subscriptions[topic] = (subscription, task)
        for topic in [topic for topic in self._subscriptions if topic not in wanted]:
            await self._leave(topic)
        if level != self.level:
            if self.level is not None:  # its estimate of N crossed a level's boundary: a new mesh to join
                self._counters.add("topic_level_changes")
            logger.info("peer %s listens to announcement topic(s) %s", self._peer, ", ".join(wanted))
            self.level = level
        await self._dial_topic_peers(level)

    async def _read(self, subscription: Subscription) -> None:
        async for message in subscription.messages():
            try:
                self._on_announcement(message.data, message.sender)
            except Exception as e:  # a reader's bug must not end the subscription
                self._counters.add("announcement_errors")
                logger.warning("peer %s: taking an announcement failed: %s: %s", self._peer, type(e).__name__, e)
        if subscription.topic in self._subscriptions and self._subscriptions[subscription.topic][0] is subscription:
            del self._subscriptions[subscription.topic]  # the daemon ended it: the next round subscribes again

    async def _leave(self, topic: str) -> None:
        subscription, task = self._subscriptions.pop(topic)
        await subscription.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def _dial_topic_peers(self, level: int) -> None:
        p2p = self._p2p()
        hosts = self._topic_hosts(level)
        if not hosts:
            return
        connected = {info.peer_id.to_base58() for info in await p2p.list_peers()}
        from hivemind.p2p import PeerID

        for host in [host for host in hosts if host not in connected][:_DIALS_PER_ROUND]:
            try:
                await asyncio.wait_for(connect(p2p, PeerID.from_base58(host), []), self.config.wait_timeout)
                self._counters.add("topic_dials")
            except Exception as e:  # gone, or unreachable: its announcements come through others
                self._counters.add("topic_dial_failures")
                logger.debug("peer %s: dialling topic peer %s failed: %r", self._peer, host, e)

    async def announce(self, data: bytes) -> bool:
        """Publish one announcement on this peer's publishing topics; True if at least one took it."""
        level = self.level if self.level is not None else self._topic_level()
        sent = 0
        for topic in publish_topics(self._peer, level, self.config):
            try:
                await asyncio.wait_for(publish(self._p2p(), topic, data), self.config.wait_timeout)
                sent += 1
            except Exception as e:
                self._counters.add("announce_failures")
                logger.warning("peer %s: announcing on %s failed: %s: %s", self._peer, topic, type(e).__name__, e)
        if sent:
            self._counters.add("announcements_sent")
            self._counters.add("announcement_bytes", len(data))
        return sent > 0

    async def close(self) -> None:
        """Leave every topic."""
        for topic in list(self._subscriptions):
            with contextlib.suppress(Exception):
                await self._leave(topic)


def topic_mates(senders: dict[str, str], level: int, shards: list[int]) -> list[str]:
    """The hosts (values of ``senders``, by peer id) of the peers whose home topic at ``level`` is one of
    ``shards`` (the topics a peer listens to), in random order."""
    wanted = set(shards)
    hosts = [host for sender, host in senders.items() if home_topic_shard(sender, level) in wanted]
    random.shuffle(hosts)  # rounds dial a few each: not always the same ones first
    return hosts
