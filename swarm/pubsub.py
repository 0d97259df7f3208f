"""libp2p pubsub (GossipSub) through a p2pd daemon's control protocol: start the daemon with it, publish, subscribe.

hivemind's bundled ``p2pd`` has GossipSub (its ``-pubsub`` flag; GossipSub is the default router) and its control
protocol has publish and subscribe requests, but hivemind never passes the flag and its Python client has no pubsub
calls. :class:`PubsubP2P` is hivemind's :class:`~hivemind.p2p.P2P` whose daemon runs pubsub, and the functions below
speak the daemon's pubsub requests (each on its own control connection, as the daemon expects):

- :func:`publish`: one ``PUBLISH`` request; the daemon signs the message with the peer's libp2p key and sends it to
  the topic's mesh (or, on a topic this peer is not subscribed to, to a few peers it knows are);
- :func:`subscribe`: a ``SUBSCRIBE`` request, after which the connection carries the topic's messages until it is
  closed (closing it unsubscribes);
- :func:`topic_peers`: the connected peers the daemon knows to be subscribed to a topic.

GossipSub forms its mesh among peers that are connected and subscribed to the same topic; the daemon has no peer
discovery of its own for topics, so the caller connects peers that should share a topic (:mod:`swarm.gossip`).
The daemon verifies every message's libp2p signature (its default strict signing), so a message's ``sender`` is the
libp2p peer that published it, whoever forwarded it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import raise_if_failed, read_unsigned_varint, write_pbmsg
from hivemind.proto import p2pd_pb2

MAX_MESSAGE_BYTES = 1 << 16
"""The largest pubsub message read from the daemon; a larger one is skipped (the daemon allows up to 1 MiB)."""


class PubsubP2P(P2P):
    """hivemind's :class:`~hivemind.p2p.P2P` whose ``p2pd`` runs libp2p pubsub with the GossipSub router.

    Created like :class:`~hivemind.p2p.P2P` (``await PubsubP2P.create(...)``); everything else is unchanged.
    """

    @staticmethod
    def _make_process_args(*args: Any, **kwargs: Any) -> list[str]:
        # hivemind builds the daemon's command line here; pubsub is one more of its flags
        return P2P._make_process_args(*args, **kwargs, pubsub=True)


@dataclass(frozen=True)
class PubsubMessage:
    """One message of a subscription.

    Parameters:
        topic (`str`): the topic it was published on.
        data (`bytes`): what the publisher sent.
        sender (`str`): the libp2p peer id (base58) that published it, verified by the daemon.
    """

    topic: str
    data: bytes
    sender: str


async def _request(
    p2p: P2P, request: p2pd_pb2.PSRequest
) -> tuple[p2pd_pb2.Response, asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a control connection, send one pubsub request, read the daemon's answer (raises on an error answer);
    the connection stays open for the caller."""
    reader, writer = await p2p._client.control.daemon_connector.open_connection()
    try:
        await write_pbmsg(writer, p2pd_pb2.Request(type=p2pd_pb2.Request.PUBSUB, pubsub=request))
        response = p2pd_pb2.Response()
        response.ParseFromString(await _read_frame(reader, MAX_MESSAGE_BYTES))
        raise_if_failed(response)
    except BaseException:
        writer.close()
        raise
    return response, reader, writer


async def _read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """One varint-delimited frame of the control protocol; a frame over ``max_bytes`` is skipped in pieces, never
    held whole, and read as ``b""``."""
    size = await read_unsigned_varint(reader)
    if size <= max_bytes:
        return await reader.readexactly(size)
    while size > 0:
        skipped = await reader.read(min(size, max_bytes))
        if not skipped:
            raise asyncio.IncompleteReadError(b"", size)
        size -= len(skipped)
    return b""


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def publish(p2p: P2P, topic: str, data: bytes) -> None:
    """Publish ``data`` on ``topic``; returns once the daemon accepted it (raises on a daemon error)."""
    _, _, writer = await _request(p2p, p2pd_pb2.PSRequest(type=p2pd_pb2.PSRequest.PUBLISH, topic=topic, data=data))
    await _close(writer)


async def topic_peers(p2p: P2P, topic: str) -> list[str]:
    """The connected peers (base58 libp2p ids) the daemon knows to be subscribed to ``topic``."""
    response, _, writer = await _request(p2p, p2pd_pb2.PSRequest(type=p2pd_pb2.PSRequest.LIST_PEERS, topic=topic))
    await _close(writer)
    return [PeerID(peer).to_base58() for peer in response.pubsub.peerIDs]


class Subscription:
    """This peer's subscription to one topic: iterate :meth:`messages`; :meth:`close` unsubscribes.

    Use :func:`subscribe` to make one.
    """

    def __init__(self, topic: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.topic = topic
        self._reader = reader
        self._writer = writer  # the connection lives as long as this reference: closing it unsubscribes

    async def messages(self) -> AsyncIterator[PubsubMessage]:
        """The topic's messages as they arrive (this peer's own included), until :meth:`close` or the daemon's end;
        a message over :data:`MAX_MESSAGE_BYTES` or one that does not parse is skipped."""
        while not self._writer.is_closing():
            try:
                frame = await _read_frame(self._reader, MAX_MESSAGE_BYTES)
            except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                return
            if not frame:  # oversized
                continue
            message = p2pd_pb2.PSMessage()
            try:
                message.ParseFromString(frame)
            except Exception:  # a frame from the daemon that is no message: skip it, as an oversized one
                continue
            sender = PeerID(getattr(message, "from")).to_base58() if message.HasField("from") else ""
            yield PubsubMessage(topic=self.topic, data=message.data, sender=sender)

    @property
    def closed(self) -> bool:
        """True once closed (by :meth:`close` or by the daemon)."""
        return self._writer.is_closing() or self._reader.at_eof()

    async def close(self) -> None:
        """Unsubscribe: close the connection that carries the topic's messages."""
        await _close(self._writer)


async def subscribe(p2p: P2P, topic: str) -> Subscription:
    """Subscribe this peer to ``topic``; raises if the daemon refuses (e.g. it runs without pubsub)."""
    _, reader, writer = await _request(p2p, p2pd_pb2.PSRequest(type=p2pd_pb2.PSRequest.SUBSCRIBE, topic=topic))
    return Subscription(topic, reader, writer)
