"""GossipSub through p2pd's control protocol, on real daemons on loopback: the smoke test of swarm.pubsub."""

# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from hivemind.utils.multiaddr import Multiaddr

from swarm.config import nat_options
from swarm.daemon import close_p2p
from swarm.hivemind_bridge import PubsubP2P
from swarm.pubsub import publish, subscribe, topic_peers
from tests.swarm_fixtures import no_p2pd_left_behind, record_p2pd  # noqa: F401

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")


async def _daemons(count: int) -> list[PubsubP2P]:
    """``count`` daemons on loopback in a chain; any made are closed if a later one fails (else their subprocess
    transports outlived this test's event loop and failed a later test when collected)."""
    daemons: list[PubsubP2P] = []
    try:
        first = await PubsubP2P.create(host_maddrs=LOOPBACK, **nat_options(LOOPBACK))
        daemons.append(first)
        record_p2pd(first._child.pid, [first._daemon_listen_maddr["unix"], first._client_listen_maddr["unix"]])
        address = [str(a) for a in await first.get_visible_maddrs()]
        for _ in range(count - 1):
            p2p = await PubsubP2P.create(initial_peers=address, host_maddrs=LOOPBACK, **nat_options(LOOPBACK))
            daemons.append(p2p)
            record_p2pd(p2p._child.pid, [p2p._daemon_listen_maddr["unix"], p2p._client_listen_maddr["unix"]])
        # a chain: the last daemon reaches the first only through the others' mesh
        for left, right in zip(daemons[1:], daemons[2:], strict=False):
            addrs = [a.decapsulate(Multiaddr(f"/p2p/{right.peer_id}")) for a in await right.get_visible_maddrs()]
            await _connect(left, right.peer_id, addrs)
    except BaseException:
        for p2p in daemons:
            with contextlib.suppress(Exception):
                await close_p2p(p2p)
        raise
    return daemons


async def _connect(p2p: PubsubP2P, peer_id, addrs, tries: int = 3) -> None:
    """Dial ``peer_id``, again after a failed handshake (two daemons of one machine dialing each other at once may
    break the first: "noise: message is too short")."""
    for attempt in range(tries):
        try:
            await p2p._client.connect(peer_id, addrs)
            return
        except Exception:
            if attempt == tries - 1:
                raise
            await asyncio.sleep(0.5)


async def _until(condition, timeout: float = 20.0, what=lambda: None) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"condition not met in time: {what()}"
        await asyncio.sleep(0.1)


def test_a_message_published_on_a_topic_reaches_every_subscriber_once_with_its_publisher_id():
    async def scenario() -> None:
        daemons = await _daemons(3)
        # warm-up messages (below) are counted apart, so a late one cannot pass for a message under test
        subscriptions, received, warm_ups = [], {i: [] for i in range(3)}, {i: [] for i in range(3)}
        readers = []
        try:
            for i, p2p in enumerate(daemons):
                subscription = await subscribe(p2p, "sapo/test")
                subscriptions.append(subscription)

                async def read(i: int = i, subscription=subscription) -> None:
                    async for message in subscription.messages():
                        (warm_ups if message.data == b"warm-up" else received)[i].append(message)

                readers.append(asyncio.create_task(read()))

            async def each_knows_the_others() -> bool:
                return all([len(await topic_peers(p2p, "sapo/test")) == len(daemons) - 1 for p2p in daemons])

            await _until(each_knows_the_others)

            # A publisher sends to its mesh, which GossipSub builds at its heartbeats: a message published before
            # then can be lost. Warm-up messages until each subscriber has had one, then the messages under test.
            async def warmed_up() -> bool:
                await publish(daemons[2], "sapo/test", b"warm-up")
                return await _all_have(warm_ups, 1)

            await _until(warmed_up)
            await publish(daemons[2], "sapo/test", b"announcement")
            await _until(lambda: _all_have(received, 1), what=lambda: {i: len(m) for i, m in received.items()})
            await asyncio.sleep(1.0)  # time for any duplicate to arrive
            for i in range(3):
                assert [m.data for m in received[i]] == [b"announcement"]
                assert received[i][0].sender == daemons[2].peer_id.to_base58()
                assert received[i][0].topic == "sapo/test"
            # another topic's messages do not arrive, and an unsubscribed peer gets nothing more
            await publish(daemons[0], "sapo/other", b"elsewhere")
            await subscriptions[1].close()
            await asyncio.sleep(0.5)
            await publish(daemons[0], "sapo/test", b"second")
            await _until(lambda: _has(received[2], b"second"))
            await asyncio.sleep(1.0)
            assert [m.data for m in received[1]] == [b"announcement"]
            assert [m.data for m in received[2]] == [b"announcement", b"second"]
        finally:
            for task in readers:
                task.cancel()
            for subscription in subscriptions:
                with contextlib.suppress(Exception):
                    await subscription.close()
            for p2p in daemons:
                await close_p2p(p2p)

    asyncio.run(scenario())


async def _all_have(received: dict, count: int) -> bool:
    return all(len(messages) >= count for messages in received.values())


async def _has(messages: list, data: bytes) -> bool:
    return any(m.data == data for m in messages)


def test_a_daemon_without_pubsub_refuses_a_subscription_with_an_error():
    from hivemind.p2p import P2P

    async def scenario() -> None:
        p2p = await P2P.create(host_maddrs=LOOPBACK, **nat_options(LOOPBACK))
        record_p2pd(p2p._child.pid, [p2p._daemon_listen_maddr["unix"], p2p._client_listen_maddr["unix"]])
        try:
            with pytest.raises(Exception, match="(?i)pubsub"):
                await subscribe(p2p, "sapo/test")
        finally:
            await close_p2p(p2p)

    asyncio.run(scenario())


def test_a_peer_whose_topic_level_changes_moves_its_subscription_and_counts_the_change():
    from swarm.config import DHTTransportConfig
    from swarm.gossip import Gossip
    from swarm.levels import subscribe_topics
    from swarm.transport import SwarmCounters

    async def scenario() -> None:
        (p2p,) = await _daemons(1)
        config, counters, level = DHTTransportConfig(), SwarmCounters(), [0]
        gossip = Gossip(config, lambda: p2p, "peer-a", lambda: level[0], lambda data, sender: None,
                        lambda level: [], counters)  # fmt: skip
        try:
            await gossip.keep()
            await gossip.keep()  # the same level: nothing moves
            assert gossip.topics() == subscribe_topics("peer-a", 0, config)
            assert counters.snapshot().get("topic_level_changes", 0) == 0
            level[0] = 3  # the estimate of N crossed a boundary
            await gossip.keep()
            assert gossip.topics() == subscribe_topics("peer-a", 3, config) and gossip.level == 3
            assert counters.snapshot()["topic_level_changes"] == 1
        finally:
            await gossip.close()
            await close_p2p(p2p)

    asyncio.run(scenario())
