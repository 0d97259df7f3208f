"""One peer's swarm transport over the hivemind DHT: a peer, a publisher, a reader and its announcement topics behind
SwarmTransport.

:class:`DHTTransport` runs one hivemind :class:`~hivemind.dht.node.DHTNode` (and its ``p2pd`` daemon) on an
asyncio event loop in a background thread of this process (:mod:`swarm.peer`). Every public method is synchronous,
thread-safe and never waits on the network: :meth:`DHTTransport.publish` queues (:mod:`swarm.publisher`),
:meth:`DHTTransport.fetch` takes groups from a cache that a background poller keeps filled (:mod:`swarm.reader`).

Layout in the DHT (all values are msgpack bytes of :mod:`swarm.records`, owner-signed by :mod:`swarm.validation`):

- ``f"{swarm_name}/records/{sender}/{seq}"``: one :class:`~swarm.records.GroupRecord` (the groups of
  one publish call) under subkey = the owner marker ``[owner:<public key>]`` of the sender. By default the
  publisher serves it from its own p2pd (:mod:`swarm.served`, signed as a DHT store would carry it) and only the
  index is in the DHT; a peer in client mode, or with ``serve_records=False``, stores it in the DHT;
- ``f"{swarm_name}/index/{shard}"`` (level 0) and ``f"{swarm_name}/index/L{level}/{shard}"``: small dictionaries,
  one subkey per peer (its owner marker) holding its :class:`~swarm.records.IndexEntry` (model name, last few
  record references, the libp2p id that serves them); ``shard`` comes from a hash of the sender, so no key
  carries everyone's payload, and level ``l`` has ``index_shards * 2**l`` shards, so a reader finds a level with a
  few entries per shard at any swarm size (:mod:`swarm.levels`, :mod:`swarm.index_reader`). The index serves
  bootstrap, late joiners, :meth:`DHTTransport.peers` and the estimate of N; it is rewritten every
  ``announce_interval``.

Fresh records travel by push (``gossip``, the default): a publisher announces each record at once on its
announcement topics over GossipSub (:mod:`swarm.gossip`, :mod:`swarm.announcements`, ``f"{swarm_name}/announce/
L{level}/{shard}"``, split as the swarm grows so that a topic carries about ``topic_peers`` publishers), and a
reader fetches the freshest records announced just before its next :meth:`DHTTransport.fetch` is due
(:mod:`swarm.reader`). A closed swarm (``membership_path``) accepts its members alone (:mod:`swarm.membership`); a
peer nobody can dial switches to client mode (:mod:`swarm.reachability`).

Traps of hivemind 1.1.12 this package works around:

- ``hivemind.DHT`` (process-based) breaks its pipe on values over ~16 KiB: we drive ``DHTNode`` directly;
- one lookup RPC carries all requested keys in one message capped at 4 MiB: records are read at most
  three keys per ``get_many`` (hivemind then sends one key per RPC), and records are capped below that;
- ``store()`` may report success for a value nobody can read back: sizes are enforced before storing;
- if ``p2pd`` dies, hivemind fails silently: a watchdog reports it (:meth:`DHTTransport.healthy`);
- a failed bootstrap leaves its ``p2pd`` or its socket file behind: the peer creates the
  :class:`~hivemind.p2p.P2P` itself and cleans both up;
- a frozen peer costs each lookup 3-9 s before it is blacklisted: all network work runs in the background thread.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from swarm.announcement_gate import AnnouncementGate
from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import MULTIADDR_FORM, DHTTransportConfig, validate_addresses, validate_multiaddr
from swarm.daemon import ProcessIdentity
from swarm.dht_values import TypedDHTSerializer
from swarm.fetcher import ReasonedRejections
from swarm.find_gate import FindGate
from swarm.gossip import GOSSIP_ROUND_SECONDS, Gossip, topic_mates
from swarm.identity import load_or_create_signing_key
from swarm.levels import subscribed_shards
from swarm.membership import Membership, MembershipValidator, load_membership
from swarm.peer import BackgroundJob, DHTPeer, SwarmJoinError
from swarm.ping_gate import PingGate, RoutingGuard
from swarm.publisher import SwarmPublisher
from swarm.reachability import DIAL_BACK_HANDLER, DialBack, tcp_ports
from swarm.reader import SwarmReader
from swarm.records import Group, ReceivedGroup
from swarm.serve_gate import ServeGate
from swarm.served import PeerServedLookup, ServedRecords
from swarm.store_gate import StoreGate
from swarm.transport import PeerInfo, SwarmCounters, SwarmTransport, TimingLog, TransportReadout
from swarm.validation import fingerprint, make_record_validator

logger = logging.getLogger(__name__)

__all__ = [
    "MULTIADDR_FORM",
    "DHTSwarm",
    "DHTSwarmConfig",
    "DHTTransport",
    "DHTTransportConfig",
    "SwarmJoinError",
    "validate_multiaddr",
]


class DHTTransport(SwarmTransport):
    """One peer's transport in a swarm over the hivemind DHT; see the module docstring for the layout and traps.

    Example:
        >>> first = DHTTransport(DHTTransportConfig(model_name="tiny"))
        >>> second = DHTTransport(DHTTransportConfig(initial_peers=first.visible_addresses()))
        >>> first.publish(groups); ...; second.fetch(4)

    Args:
        config: the peer's settings; keyword ``overrides`` replace single fields of it.
        clock: read by the publisher and the reader (record dates, expiry, intervals); tests inject a
            :class:`~swarm.clock.ManualClock`.

    Raises:
        ValueError: a malformed multiaddr in the config.
        SwarmJoinError: no initial peer answered within ``config.join_timeout``.
    """

    def __init__(self, config: DHTTransportConfig | None = None, clock: Clock = SYSTEM_CLOCK, **overrides: Any):
        config = dataclasses.replace(config or DHTTransportConfig(), **overrides)
        validate_addresses(config)
        self.config = config
        signing_key = load_or_create_signing_key(config.signing_key_file())
        public_key = self.public_key = signing_key.get_public_key().to_bytes()
        self._peer_id = fingerprint(public_key)
        membership = self.membership = self._membership(config)
        self._check_member()
        self._counters = SwarmCounters()
        self._timings = TimingLog(clock)
        # a refused record strikes its sender with the reason; a refused stored value, the libp2p peer that sent it;
        # a libp2p peer storing more than its budget rests too, and the peers of one host share a budget
        store_gate = self.store_gate = StoreGate(
            self._counters,
            budget_bytes=config.store_budget_bytes,
            budget_values=config.store_budget_values,
            host_budget_peers=config.store_budget_host_peers,
        )
        # a find request names a bounded number of keys, and one libp2p peer's finds take a budget per window
        self.find_gate = FindGate(self._counters, budget_bytes=config.find_budget_bytes)
        # and what one libp2p peer's record requests take of what this node serves (each record once, a few retries)
        self.serve_gate = ServeGate(self._counters)
        # one libp2p peer's pings take a budget per window; it goes under one node id in the routing table, and
        # hivemind's copy of stored values to a newcomer (a loop over every key stored here) runs now and then
        self.ping_gate = PingGate(self._counters)
        self.routing_guard = RoutingGuard(counters=self._counters)
        rejections = ReasonedRejections(self._counters, on_refusal=store_gate.refused)
        validator = make_record_validator(
            signing_key,
            config.swarm_name,
            config.index_shards,
            config.limits,
            rejections,
            extra=[] if membership is None else [MembershipValidator(membership.admits, rejections)],
            # Peers with a longer record_ttl than ours are refused: what is stored here expires within our ttl (its
            # amount is bounded by the store gate's budget per sender and by dht_storage_bytes, see swarm/peer.py).
            max_ttl=config.record_ttl + config.clock_skew_tolerance + 60.0,
            index_max_level=config.index_max_level,
        )
        # a dictionary larger than this node's own storage answers with is no honest holder's (each trims its keys to
        # dht_key_subkeys): refused whole, a hostile answer costs no check of its thousands of signed entries
        values = TypedDHTSerializer(config.limits.max_record_bytes, rejections, max_items=config.dht_key_subkeys)
        self.peer = DHTPeer(
            config,
            validator,
            self._peer_id,
            self._counters,
            clock,
            value_serializer=values,
            store_gate=store_gate,
            find_gate=self.find_gate,
            serve_gate=self.serve_gate,
            ping_gate=self.ping_gate,
            routing_guard=self.routing_guard,
        )
        # A peer others cannot dial (client mode) stores its records in the DHT instead of serving them.
        self.served = None
        if config.serve_records and not config.client_mode:
            self.served = ServedRecords(
                validator, config.index_records + config.max_pending_publishes, self._counters, clock
            )
        lookup = PeerServedLookup(
            lambda: self.peer.p2p.call_protobuf_handler, validator, config.limits.max_record_bytes + 4096
        )
        self.reader = SwarmReader(
            config, public_key, self._counters, self._timings, clock, served=lookup,
            admits=None if membership is None else membership.admits, prior=self.peer.size_prior,
            validator_rejections=rejections,
        )  # fmt: skip
        self.gossip = None
        if config.gossip:
            self.gossip = Gossip(
                config, lambda: self.peer.p2p, self._peer_id, self.reader.topic_level,
                AnnouncementGate(
                    self._counters, lambda: self.peer.libp2p_peer_id.to_base58(),
                    known_hosts=lambda: self.reader.book.hosts().values(),
                ).guard(self.reader.take_announcement),
                lambda level: topic_mates(
                    self.reader.book.hosts(), level, subscribed_shards(self._peer_id, level, config)
                ), self._counters,
            )  # fmt: skip
        # The publisher writes its index entry to the levels that readers of the swarm size this reader sees read,
        # once the reader has read the index (a peer that has not looked does not know where to write).
        self.publisher = SwarmPublisher(
            config, public_key, self._counters, self._timings, clock, write_levels=self.reader.write_levels,
            served=self.served, announce=self.gossip.announce if self.gossip is not None and config.announce else None,
            signing_key=signing_key, may_write_index=lambda: self.reader.index.reads > 0,
        )  # fmt: skip
        jobs = [
            BackgroundJob("publish", self.publisher.flush, config.poll_interval),
            BackgroundJob("poll", self.reader.poll, config.poll_interval),
        ]
        handlers, before_shutdown = [], []
        if self.gossip is not None:
            jobs.append(BackgroundJob("gossip", self.gossip.keep, GOSSIP_ROUND_SECONDS))
            before_shutdown.append(self.gossip.close)
        self.dial_back = DialBack(
            lambda: self.peer.p2p, self._listening_ports, self.peer.neighbour_peer_ids, config.wait_timeout,
            self._counters, self._became_unreachable, self._became_reachable,
        )  # fmt: skip
        if not config.client_mode:
            handlers.append((DIAL_BACK_HANDLER, self.dial_back.handle))
            if config.check_reachability:
                jobs.append(BackgroundJob("reachability", self.dial_back.check, GOSSIP_ROUND_SECONDS))
        self.peer.start(jobs, served=self.served, handlers=handlers, before_shutdown=before_shutdown)

    @staticmethod
    def _membership(config: DHTTransportConfig) -> Membership | None:
        """The closed swarm's membership (``None``: an open swarm); raises ``ValueError`` if it does not verify."""
        if config.membership_path is None:
            return None
        return load_membership(config.membership_path, config.membership_operator, config.swarm_name)

    def _check_member(self) -> None:
        membership = self.membership
        if membership is not None and not membership.admits(self._peer_id):
            raise ValueError(
                f"peer {self._peer_id} is not a member of closed swarm {self.config.swarm_name!r} "
                f"({self.config.membership_path}): ask its operator to add {self._peer_id} and sign the file again"
            )

    def _listening_ports(self) -> list[int]:
        """The TCP ports other peers are told to dial (the announced addresses, else those listened on)."""
        from hivemind.utils.multiaddr import Multiaddr

        return tcp_ports([Multiaddr(addr) for addr in self.visible_addresses()])

    async def _became_unreachable(self, answers: int) -> None:
        """A reachability check found that no peer can dial this one: switch to client mode and say so."""
        if self.served is not None:
            self.served.host = None  # records go to the DHT from now on; announcements name no host
        await self.peer.become_client()
        # the records served so far, which readers can no longer fetch from this peer, go to the DHT too
        stored = await self.publisher.store_served(self.peer.node)
        logger.warning(
            "peer %s is not reachable: %d peer(s) could not connect to %s. Switched to client mode: it keeps "
            "publishing (records stored in the DHT, the %d it served and not yet expired included) and "
            "fetching, but offers no DHT service. To serve, make the port reachable (port forwarding, a firewall "
            "rule) and set announce_maddrs to the public address.",
            self._peer_id, answers, self.visible_addresses(), stored,
        )  # fmt: skip

    async def _became_reachable(self) -> None:
        """A later check found a neighbour that could dial this peer: back to server mode, serving its records."""
        await self.peer.become_server()
        if self.served is not None:
            self.served.host = self.peer.p2p.peer_id.to_base58()  # records served again, as before the switch
        logger.warning(
            "peer %s is reachable again at %s: back to server mode (DHT service, records served)",
            self._peer_id, self.visible_addresses(),
        )  # fmt: skip

    @property
    def peer_id(self) -> str:
        """Fingerprint of this peer's signing key: what others see as :attr:`ReceivedGroup.sender`."""
        return self._peer_id

    @property
    def p2pd_pid(self) -> int | None:
        """Process id of this peer's p2pd daemon."""
        return self.peer.p2pd_pid

    @property
    def p2pd(self) -> ProcessIdentity | None:
        """This peer's p2pd daemon (pid and start time): once it is gone, its pid may name another process."""
        return self.peer.p2pd

    @property
    def socket_paths(self) -> list[str]:
        """Unix socket files of this peer's p2pd and its client."""
        return self.peer.socket_paths

    def visible_addresses(self) -> list[str]:
        """Multiaddrs (with ``/p2p/<peer id>``) that other peers pass as ``initial_peers`` to join."""
        return self.peer.visible_addresses()

    def publish(self, groups: Sequence[Group]) -> None:
        """Queue ``groups`` as one record and return at once; the background thread stores it.

        Raises:
            RecordRejected: the groups break this peer's own limits (e.g. ``too_large``).
            RuntimeError: the transport is closed.
        """
        if self.peer.closed:
            raise RuntimeError(f"DHTTransport of peer {self._peer_id} is closed")
        if not groups:
            return
        self.publisher.queue(groups)
        self.peer.wake("publish")

    def fetch(self, max_groups: int) -> list[ReceivedGroup]:
        """Take up to ``max_groups`` cached groups of other peers, never returned before; never blocks."""
        if max_groups <= 0 or self.peer.closed:
            return []
        taken = self.reader.take(max_groups)
        if len(taken) < max_groups:
            self.peer.wake("poll")  # refill early
        return taken

    def peers(self) -> list[PeerInfo]:
        """Other peers heard from (an index entry or an announcement) within the record ttl, departed ones left out.

        A peer counts once it announces itself, records or none: with ``announce`` (the default) it stores its index
        entry and says "still here" every ``announce_interval``, so a joining reader lists it within a few
        ``index_min_interval`` (its first index reads) or one ``announce_interval``. A peer with ``announce=False`` (a
        relay) is never listed.
        """
        return self.reader.peers()

    def judge(self, sender: str, usable: bool) -> None:
        """Be told the node's verdict on one group of ``sender``: a sender whose groups are mostly judged usable earns
        a share of each refill of its own; until then it shares the pool of the senders not judged good
        (``refill_unjudged_share``, :mod:`swarm.refill`)."""
        self.reader.judge(sender, usable)

    def bench(self, sender: str, seconds: float) -> None:
        """Be told that the node benched ``sender`` for ``seconds``: none of its records is fetched meanwhile (it rests
        in the reader's book, :meth:`swarm.senders.SenderBook.bench`), so that they take no room of a refill."""
        self.reader.bench(sender, seconds)

    def refusals(self) -> list[tuple[str, str]]:
        """Records refused (``rejected/<reason>``) or announced and never served (``never_served``) since the last
        call, as ``(sender, reason)``, oldest first: each also rested its sender here (:mod:`swarm.senders`)."""
        return self.reader.refusals()

    def neighbours(self) -> int:
        """DHT neighbours now; 0 means this peer is alone and keeps trying to (re)join (``rejoin_interval``)."""
        return self.peer.neighbour_count()

    def ready_groups(self) -> int:
        """Groups of others fetched and validated in the background, which :meth:`fetch` hands out at once."""
        return self.reader.cached_groups()

    def healthy(self) -> bool:
        """False once closed, or if p2pd or the background thread died (the peer then neither sends nor gets)."""
        return self.peer.healthy()

    def readout(self) -> TransportReadout:
        """Counters (published, fetched, rejected/<reason>, p2pd_deaths, rejoins, ...), gauges and timings."""
        return TransportReadout(
            peer_id=self._peer_id,
            healthy=self.healthy(),
            counters=self._counters.snapshot(),
            gauges={
                "dht_stored_items": float(self.peer.stored_items()),
                "dht_stored_bytes": float(self.peer.stored_bytes()),
                "dht_neighbours": float(self.peer.neighbour_count()),
                **self.reader.gauges(),
            },
            timings=self._timings.snapshot(),
            addresses=self.visible_addresses(),
        )

    def close(self, timeout: float = 30.0) -> None:
        """Leave the swarm: stop the background work, shut down the DHT node and p2pd, remove socket files.

        Blocks until done, about ``timeout`` seconds at most (default 30): a graceful shutdown still running then is
        cut short (p2pd killed). Calling it again does nothing.
        """
        if self.peer.closed:
            return
        self.peer.close(timeout)
        logger.info("peer %s left swarm %r", self._peer_id, self.config.swarm_name)


# The names before the transport was split (a peer's transport, not a whole swarm): kept for existing scripts.
DHTSwarm = DHTTransport
DHTSwarmConfig = DHTTransportConfig
