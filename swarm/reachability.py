"""Whether other peers can dial this one: a dial-back request peers answer for each other, and the check that makes an
unreachable peer switch to client mode.

A peer behind NAT (or a firewall, or announcing a wrong address) reaches others over the connections it opens, but
nobody can open one to it. Left in server mode it enters other peers' routing tables and serves records nobody can
fetch, so every peer that dials it waits a timeout. After joining, a peer asks a few of its DHT neighbours to dial it
back (:data:`DIAL_BACK_HANDLER`): each opens a plain TCP connection to the IP address the request came from (as it
sees it: never an address the asker names, so that nobody can be made to dial a third party) at the ports the peer
says it listens on.

An answer cannot be checked: a neighbour that says "could not connect" may not have dialled at all, and one that does
not answer may be slow, gone, or refusing because others' requests used up its answers for the minute (fresh
identities cost nothing). So the verdict asks more than two answers. A check asks three neighbours drawn at random
(not the first ones the routing table met, which a peer joining early or with an id near this one's could be), and
asks another neighbour for each that did not answer, at most six in all. The peer is unreachable when three said they
could not connect (two, when it has two neighbours), none that it could, and more answered than stayed silent: it
switches to client mode (no DHT service, records stored in the DHT instead of served) and says so in its log. One that
could connect makes it reachable. Neither: no verdict, and it asks again a minute later. A verdict is checked again
every half hour, in client mode too: a peer that finds a neighbour that connected goes back to server mode, so that
neighbours lying once cost it at most half an hour of service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

import msgpack
import msgspec
from google.protobuf.wrappers_pb2 import BytesValue

from swarm.transport import SwarmCounters

logger = logging.getLogger(__name__)

DIAL_BACK_HANDLER = "sapo_swarm.dial_back"
"""The libp2p protocol name a peer answers dial-back requests under."""

_MAX_PORTS = 4  # ports one request may name
_ANSWER_EVERY = 60.0  # seconds between two dial-backs this peer makes for the same asker
# Dial-backs made for all askers together within _ANSWER_EVERY: identities cost nothing, so a per-asker bound alone
# lets fresh ones make this peer dial (and look up its peers) without end. A joining peer asks three neighbours once,
# and again every half hour: an honest swarm asks one peer a few times an hour; refused, an asker asks again later.
_ANSWERS_PER_WINDOW = 30
_ASKED = 3  # neighbours asked per check, and the refusals a verdict "unreachable" needs (two with two neighbours)
_MOST_ASKED = 6  # neighbours asked per check at most, those that did not answer replaced by others
_CHECK_AGAIN = 1800.0  # seconds between two checks once one gave a verdict


def encode_ports(ports: Sequence[int]) -> bytes:
    """A dial-back request: the TCP ports the asker listens on."""
    return msgpack.packb([int(port) for port in ports[:_MAX_PORTS]])


_PORTS = msgspec.msgpack.Decoder(
    Annotated[list[Annotated[int, msgspec.Meta(ge=1, le=65535)]], msgspec.Meta(min_length=1, max_length=_MAX_PORTS)]
)
_VERDICT = msgspec.msgpack.Decoder(bool)
_MAX_MESSAGE_BYTES = 64  # four ports are 13 bytes packed


def decode_ports(data: bytes) -> list[int]:
    """The ports of a dial-back request, decoded typed; raises ``ValueError`` on anything else."""
    if len(data) > _MAX_MESSAGE_BYTES:
        raise ValueError(f"a dial-back request of {len(data)} bytes: it is a list of 1 to 4 ports")
    try:
        return _PORTS.decode(data)
    except (msgspec.DecodeError, RecursionError) as e:
        raise ValueError(f"a dial-back request is a list of 1 to 4 ports in [1, 65535]: {e}") from None


def decode_verdict(data: bytes) -> bool:
    """A dial-back answer: whether the peer asked could connect (a msgpack boolean, decoded typed); raises
    ``ValueError`` on anything else."""
    if len(data) > _MAX_MESSAGE_BYTES:
        raise ValueError(f"a dial-back answer of {len(data)} bytes is no boolean")
    try:
        return _VERDICT.decode(data)
    except (msgspec.DecodeError, RecursionError) as e:
        raise ValueError(f"a dial-back answer is a boolean: {e}") from None


def tcp_ports(maddrs: Sequence[Any]) -> list[int]:
    """The TCP ports of some multiaddrs (``/ip4/.../tcp/PORT/...``)."""
    ports = []
    for maddr in maddrs:
        with contextlib.suppress(Exception):
            port = int(maddr["tcp"])
            if port not in ports:
                ports.append(port)
    return ports


def observed_ip(addrs: Sequence[Any], direct_only: bool = False) -> str | None:
    """The IP address of the first address of a connected peer as this peer's daemon sees it; with ``direct_only``,
    of its first address that is no relay circuit (a relayed peer's address is the relay's IP)."""
    for addr in addrs:
        if direct_only and "/p2p-circuit" in str(addr):
            continue
        for protocol in ("ip4", "ip6"):
            with contextlib.suppress(Exception):
                return str(addr[protocol])
    return None


async def can_connect(ip: str, ports: Sequence[int], timeout: float) -> bool:
    """True if a TCP connection to ``ip`` opens at one of ``ports`` within ``timeout`` seconds."""
    for port in ports:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
        except (TimeoutError, OSError):
            continue
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        return True
    return False


class DialBack:
    """Answers other peers' dial-back requests (the RPC handler) and checks this peer's own reachability.

    Args:
        p2p: returns the running peer's hivemind :class:`~hivemind.p2p.P2P`.
        ports: returns the TCP ports this peer tells others to dial.
        neighbours: returns libp2p ids of DHT neighbours to ask.
        timeout: seconds a dial or a request may take.
        counters: where requests answered, checks and verdicts are counted.
        on_unreachable: awaited when a check finds this peer unreachable while it was not known so (it switches to
            client mode), with the number of peers that could not connect.
        on_reachable: awaited when a check finds this peer reachable after one had found it unreachable (it goes
            back to server mode); ``None``: nothing to do.
        rng: draws the neighbours asked.
    """

    def __init__(
        self,
        p2p: Callable[[], Any],
        ports: Callable[[], list[int]],
        neighbours: Callable[[], list[Any]],
        timeout: float,
        counters: SwarmCounters,
        on_unreachable: Callable[[int], Awaitable[None]],
        on_reachable: Callable[[], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
    ):
        self._p2p = p2p
        self._ports = ports
        self._neighbours = neighbours
        self._timeout = timeout
        self._counters = counters
        self._on_unreachable = on_unreachable
        self._on_reachable = on_reachable
        self._rng = rng or random.Random()
        self._answered: dict[str, float] = {}  # asker -> monotonic time of our last dial for it
        self.verdict: bool | None = None  # None until a check decided; True: reachable
        self._next_check = 0.0

    async def handle(self, request: BytesValue, context: Any) -> BytesValue:
        """The RPC handler: dial the asker's observed IP at the ports it names; answer whether it connected."""
        asker = context.remote_id.to_base58()
        now = time.monotonic()
        self._answered = {peer: at for peer, at in self._answered.items() if now - at < _ANSWER_EVERY}
        if asker in self._answered or len(self._answered) >= _ANSWERS_PER_WINDOW:
            self._counters.add("dial_backs_refused")
            return BytesValue()  # asked again too soon, or too many asked: no answer, no dial
        self._answered[asker] = now
        try:
            ports = decode_ports(request.value)
        except Exception:
            return BytesValue()
        infos = [info for info in await self._p2p().list_peers() if info.peer_id == context.remote_id]
        ip = observed_ip(infos[0].addrs, direct_only=True) if infos else None  # never a relay: a third party
        if ip is None:
            return BytesValue()
        self._counters.add("dial_backs_answered")
        reachable = await can_connect(ip, ports, self._timeout)
        return BytesValue(value=msgpack.packb(bool(reachable)))

    async def check(self, node: Any = None) -> None:
        """When a check is due, ask neighbours to dial this peer back (see the module docstring): switch to client
        mode if enough could not and none could, back to server mode if one could after such a switch."""
        if time.monotonic() < self._next_check:
            return
        ports = self._ports()
        neighbours = list(self._neighbours())
        if not ports or len(neighbours) < 2:
            return  # alone, or too few to judge: asked again at the next round
        self._rng.shuffle(neighbours)
        verdicts, silent = await self._ask_until_answered(neighbours, ports)
        self._counters.add("reachability_checks")
        if any(verdicts):
            self._next_check = time.monotonic() + _CHECK_AGAIN
            was_unreachable, self.verdict = self.verdict is False, True
            if was_unreachable:
                self._counters.add("reachable_again")
                if self._on_reachable is not None:
                    await self._on_reachable()
            return
        refusals = len(verdicts)
        if refusals < min(_ASKED, len(neighbours)) or refusals <= silent:
            # too few said so to outweigh lying neighbours: no verdict; those asked answer again in a minute
            self._next_check = time.monotonic() + _ANSWER_EVERY
            return
        self._next_check = time.monotonic() + _CHECK_AGAIN
        self._counters.add("unreachable")
        if self.verdict is not False:
            self.verdict = False
            await self._on_unreachable(refusals)

    async def _ask_until_answered(self, neighbours: list[Any], ports: list[int]) -> tuple[list[bool], int]:
        """Ask ``_ASKED`` of ``neighbours`` (in their order), and another for each that did not answer, at most
        ``_MOST_ASKED`` in all, until one could connect; returns the answers and how many stayed silent."""
        verdicts: list[bool] = []
        silent = asked = 0
        batch = neighbours[:_ASKED]
        while batch:
            answers = await asyncio.gather(*(self._ask(peer, ports) for peer in batch))
            asked += len(batch)
            got = [answer for answer in answers if answer is not None]
            verdicts += got
            silent += len(batch) - len(got)
            if any(got):
                break
            batch = neighbours[asked : asked + min(len(batch) - len(got), _MOST_ASKED - asked)]
        return verdicts, silent

    async def _ask(self, peer: Any, ports: list[int]) -> bool | None:
        try:
            answer = await asyncio.wait_for(
                self._p2p().call_protobuf_handler(
                    peer, DIAL_BACK_HANDLER, BytesValue(value=encode_ports(ports)), BytesValue
                ),
                3 * self._timeout,
            )
            return decode_verdict(answer.value) if answer.value else None
        except Exception as e:
            logger.debug("dial-back request to %s failed: %r", peer, e)
            return None
