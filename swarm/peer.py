"""A peer's life in the DHT: its event loop thread, p2pd and DHT node, background jobs, watchdog, rejoin, close.

:class:`DHTPeer` owns everything that outlives one call: the asyncio loop in a daemon thread, the ``p2pd`` daemon
(created here, not by hivemind, so a failed bootstrap can shut it down), the :class:`~hivemind.dht.node.DHTNode`,
and the background jobs the transport gives it (each runs every ``interval`` seconds or when woken, and a failure
is a counter and a log line, never an exception in the caller). It knows nothing of records.

Traps of hivemind 1.1.12 handled here: a failed bootstrap leaves its ``p2pd`` or socket file behind (we clean
both up); if ``p2pd`` dies hivemind fails silently (a watchdog reports it); hivemind drops a neighbour that stops
answering and never looks again, so after a partition a peer would stay alone for good (we rejoin through the
peers we knew: :mod:`swarm.rejoin`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P

from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig, nat_options
from swarm.daemon import (
    STATE_FILE,
    ProcessIdentity,
    cleanup_stale_state,
    close_p2p,
    close_stopped_loop,
    is_p2pd,
    parent_pid,
    remove_files,
    remove_stale_sockets_since,
)
from swarm.find_gate import FindGate
from swarm.hivemind_bridge import (
    BoundedStorage,
    PubsubP2P,
    bound_find_answers,
    bound_routing_updates,
    bound_storage,
    daemon_process,
    daemon_sockets,
    gate_find_handler,
    gate_ping_handler,
    gate_store_handler,
    trim_ban_counts,
)
from swarm.levels import size_from_distances
from swarm.peer_hosts import PeerHosts
from swarm.ping_gate import PingGate, RoutingGuard
from swarm.rejoin import Rejoin
from swarm.serve_gate import ServeGate
from swarm.served import RECORD_HANDLER, ServedRecords
from swarm.store_gate import StoreGate, current_storer
from swarm.transport import SwarmCounters

logger = logging.getLogger(__name__)

BAN_COUNTS_KEPT = 1000  # failure counts of peers hivemind's lookups tried, kept by the neighbours job (oldest go)
CONNECT_SECONDS = 5.0  # beyond p2pd's own start: its control client connecting and the first ping


class SwarmJoinError(RuntimeError):
    """No initial peer answered while joining a swarm (or the local daemon could not start)."""


@dataclass(frozen=True)
class BackgroundJob:
    """Work a peer repeats on its event loop: ``body(node)`` every ``interval`` seconds, or sooner when woken."""

    name: str
    body: Callable[[DHTNode], Awaitable[None]]
    interval: float


_LIVE_PEERS: weakref.WeakSet[DHTPeer] = weakref.WeakSet()


async def cancel_until_done(tasks: Sequence[asyncio.Task], timeout: float) -> None:
    """Cancel ``tasks`` and wait until they end, cancelling again any that swallowed a cancellation, for up to
    ``timeout`` seconds in all.

    On Python < 3.12, ``asyncio.wait_for`` returns its awaitable's result instead of raising ``CancelledError``
    when the cancellation arrives just as that awaitable completes (a job woken at the moment its peer closes):
    the task then runs on, and one cancel plus an unbounded ``gather`` would wait for it forever.
    """
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(0.2, max(0.0, deadline - loop.time())))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved, as gather(return_exceptions=True) did: no "never retrieved" log


@atexit.register
def _close_all_at_exit() -> None:
    for peer in list(_LIVE_PEERS):
        with contextlib.suppress(Exception):
            peer.close()


class DHTPeer:
    """One running hivemind DHT node with its p2pd daemon and event loop thread.

    Args:
        config: addresses, identity, timeouts and intervals.
        record_validator: hivemind's validator (signs what this peer stores, checks what it receives).
        label: this peer's name in log lines (its record identity).
        counters: where deaths, rejoins and background errors are counted.
        clock: monotonic time spaces the neighbour checks.
        value_serializer: what the DHT node decodes other peers' values with in place of hivemind's generic one
            (:class:`swarm.dht_values.TypedDHTSerializer`); ``None``: hivemind's.
        store_gate: what stands in front of this node's store handler (:class:`swarm.store_gate.StoreGate`: a peer
            whose stored values are mostly refused rests); ``None``: hivemind's handler alone.
        find_gate: what bounds this node's answers to find requests (:class:`swarm.find_gate.FindGate`: how many keys
            a request names, what one peer's requests take per window); ``None``: hivemind's handler.
        serve_gate: what bounds this node's answers to record requests (:class:`swarm.serve_gate.ServeGate`: what one
            peer, and the peers of one host, take per window); ``None``: every request is answered.
        ping_gate: what stands in front of this node's ping handler (:class:`swarm.ping_gate.PingGate`: one peer's
            pings per window); ``None``: hivemind's handler.
        routing_guard: what bounds the routing-table updates requests and answers start
            (:class:`swarm.ping_gate.RoutingGuard`: one node id per libp2p peer, hivemind's copy of stored values to
            a newcomer now and then); ``None``: hivemind's updates.
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        record_validator: Any,
        label: str,
        counters: SwarmCounters,
        clock: Clock = SYSTEM_CLOCK,
        value_serializer: Any = None,
        store_gate: StoreGate | None = None,
        find_gate: FindGate | None = None,
        serve_gate: ServeGate | None = None,
        ping_gate: PingGate | None = None,
        routing_guard: RoutingGuard | None = None,
    ):
        self.config = config
        self._serve_gate = serve_gate
        self._store_gate = store_gate
        self._find_gate = find_gate
        self._ping_gate = ping_gate
        self._routing_guard = routing_guard
        self._validator = record_validator
        self._value_serializer = value_serializer
        self._label = label
        self._counters = counters
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._healthy = False
        self.node: DHTNode | None = None
        self._p2p: P2P | None = None
        self._peer_hosts = PeerHosts(
            lambda: self.p2p.list_peers()
        )  # the hosts requests come from (the gates' budgets per host)
        self._p2pd_pid: int | None = None
        self._p2pd: ProcessIdentity | None = None
        self._sockets: list[str] = []
        self._visible: list[str] = []
        self._tasks: list[asyncio.Task] = []
        self._wake_events: dict[str, asyncio.Event] = {}
        self._rejoin = Rejoin(config, counters, clock, label)
        self._before_shutdown: list[Callable[[], Awaitable[None]]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name=f"swarm-dht-{label}", daemon=True)

    # ------------------------------------------------------------------------------ start and stop

    def start(
        self,
        jobs: Sequence[BackgroundJob],
        served: ServedRecords | None = None,
        handlers: Iterable[tuple[str, Callable[..., Awaitable[Any]]]] = (),
        before_shutdown: Iterable[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        """Start p2pd and the DHT node, join (or start) the swarm, then run ``jobs``; blocks until joined.

        With ``served``, this peer answers other peers' requests for the records it holds (:mod:`swarm.served`),
        and ``served.host`` is set to its libp2p id before the jobs run. ``handlers`` are further ``(protocol name,
        handler)`` pairs this peer answers (requests and answers are ``BytesValue``); ``before_shutdown`` run on the
        event loop first when the peer closes.

        Raises:
            SwarmJoinError: no initial peer answered within ``config.join_timeout``, or p2pd could not start.
        """
        self._before_shutdown = list(before_shutdown)
        self._thread.start()
        # Real wall time, not the injected clock: it is compared with the modification times of socket files.
        started = time.time()
        future = asyncio.run_coroutine_threadsafe(self._start(jobs, served, list(handlers)), self._loop)
        try:
            future.result(timeout=self.config.join_timeout + 10)
        except BaseException as e:
            future.cancel()
            self._stop_thread()
            self._kill_leftovers()
            remove_stale_sockets_since(started)
            time.sleep(0.5)  # a p2pd that failed its start may still hold its socket for a moment
            remove_stale_sockets_since(started)
            if isinstance(e, SwarmJoinError | ValueError) or not isinstance(e, Exception):
                raise  # a stop (KeyboardInterrupt, a signal handler's exception) abandons the join as it is
            raise SwarmJoinError(self._join_failure_message(f"{type(e).__name__}: {e}")) from e
        _LIVE_PEERS.add(self)

    def close(self, timeout: float = 30.0) -> None:
        """Leave: cancel the jobs, shut down the DHT node and p2pd, remove socket and state files. Idempotent.

        A graceful shutdown still running after ``timeout`` seconds is cut short: p2pd is killed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _LIVE_PEERS.discard(self)
        deadline = time.monotonic() + timeout
        if self._thread.is_alive() and not self._loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            with contextlib.suppress(Exception):
                future.result(timeout=timeout)
        self._stop_thread(timeout=min(10.0, max(1.0, deadline - time.monotonic())))
        self._kill_leftovers()
        self._healthy = False

    # ------------------------------------------------------------------------------ any thread

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def p2pd_pid(self) -> int | None:
        """Process id of this peer's p2pd daemon."""
        return self._p2pd_pid

    @property
    def p2pd(self) -> ProcessIdentity | None:
        """This peer's p2pd daemon (pid and start time): once it is gone, its pid may name another process."""
        return self._p2pd

    @property
    def socket_paths(self) -> list[str]:
        """Unix socket files of this peer's p2pd and its client."""
        return list(self._sockets)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this peer runs on, in its own thread (submit with `asyncio.run_coroutine_threadsafe`)."""
        return self._loop

    @property
    def p2p(self) -> P2P:
        """This peer's hivemind :class:`~hivemind.p2p.P2P` (its p2pd client); use it on the peer's event loop."""
        assert self._p2p is not None, "the peer has not started"
        return self._p2p

    @property
    def libp2p_peer_id(self) -> Any:
        """This peer's libp2p :class:`~hivemind.p2p.PeerID` (how hivemind RPCs address it)."""
        assert self._p2p is not None, "the peer has not started"
        return self._p2p.peer_id

    @property
    def thread_id(self) -> int | None:
        """Native id of the event loop thread (to measure its CPU time)."""
        return self._thread.native_id

    def visible_addresses(self) -> list[str]:
        """Multiaddrs (with ``/p2p/<peer id>``) that other peers pass as ``initial_peers`` to join."""
        return list(self._visible)

    def healthy(self) -> bool:
        """False once closed, or if p2pd or the event loop thread died (the peer then neither sends nor gets)."""
        return self._healthy and not self._closed and self._thread.is_alive()

    def neighbour_count(self) -> int:
        """DHT neighbours in this peer's routing table now; 0 means it is alone (and tries to rejoin)."""
        node = self.node
        return len(node.protocol.routing_table.peer_id_to_uid) if node is not None else 0

    def stored_items(self) -> int:
        """DHT items this peer stores for the swarm."""
        node = self.node
        return len(node.protocol.storage) if node is not None else 0

    def stored_bytes(self) -> int:
        """Bytes of the values (and subkeys) this peer's DHT storage holds for the swarm (at most
        ``dht_storage_bytes``)."""
        node = self.node
        storage = node.protocol.storage if node is not None else None
        return storage.nbytes() if isinstance(storage, BoundedStorage) else 0

    def neighbour_peer_ids(self) -> list[Any]:
        """libp2p ids of the DHT neighbours in this peer's routing table now."""
        node = self.node
        return list(node.protocol.routing_table.peer_id_to_uid) if node is not None else []

    def size_prior(self) -> float | None:
        """A rough estimate of the swarm's size from the DHT's own view: :func:`swarm.levels.size_from_distances` of
        the XOR distances from this node to its neighbours; ``None`` with fewer than two neighbours."""
        node = self.node
        if node is None:
            return None
        own = node.node_id
        distances = [own.xor_distance(uid) for uid in list(node.protocol.routing_table.uid_to_peer_id)]
        return size_from_distances(distances, self.config.dht_bucket_size)

    def wake(self, job: str) -> None:
        """Run background job ``job`` now instead of at its next interval (from any thread; ignored once closed)."""

        def set_event() -> None:
            if job in self._wake_events:
                self._wake_events[job].set()

        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to wake
            self._loop.call_soon_threadsafe(set_event)

    # ------------------------------------------------------------------------------ the event loop

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(self._loop_exception)
        self._loop.run_forever()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # hivemind leaves fire-and-forget tasks whose errors (mostly lost connections to peers that left)
        # nobody retrieves; they are expected in a swarm, so they go to the debug log, not stderr.
        self._counters.add("loop_errors")
        logger.debug("peer %s: background error: %s %r", self._label, context.get("message"), context.get("exception"))

    async def _start(
        self,
        jobs: Sequence[BackgroundJob],
        served: ServedRecords | None,
        handlers: list[tuple[str, Callable[..., Awaitable[Any]]]],
    ) -> None:
        config = self.config
        if config.state_dir is not None:
            os.makedirs(config.state_dir, exist_ok=True)
            cleanup_stale_state(config.state_dir)
        self._p2p = await self._create_p2p()
        child = daemon_process(self._p2p)
        self._p2pd_pid = child.pid if child is not None else None
        # our child: its pid is not reused before we reap it, so the start time read now is its own
        self._p2pd = ProcessIdentity.of(self._p2pd_pid) if self._p2pd_pid is not None else None
        self._sockets = daemon_sockets(self._p2p)
        self._write_state()
        try:
            self.node = await asyncio.wait_for(
                self._create_node(list(config.initial_peers) or None, config.client_mode), config.join_timeout
            )
        except BaseException as e:
            await close_p2p(self._p2p)
            if isinstance(e, asyncio.TimeoutError):
                raise SwarmJoinError(self._join_failure_message("timed out bootstrapping the DHT")) from None
            raise SwarmJoinError(self._join_failure_message(f"{type(e).__name__}: {e}")) from e
        self._visible = [str(m) for m in await self._p2p.get_visible_maddrs()]
        if served is not None:
            # one peer asking a public record key over and over had this node send whole records without end
            handle = served.handle if self._serve_gate is None else self._serve_gate.wrap(served, self._peer_hosts.host)
            await self._p2p.add_protobuf_handler(RECORD_HANDLER, handle, BytesValue)
            served.host = self._p2p.peer_id.to_base58()
        for name, handler in handlers:
            await self._p2p.add_protobuf_handler(name, handler, BytesValue)
        self._rejoin.remember_addresses([*config.initial_peers, *config.rejoin_peers])
        self._healthy = True
        if config.initial_peers:
            logger.info("peer %s joined swarm %r via %s", self._label, config.swarm_name, config.initial_peers)
        else:
            logger.info("peer %s bootstrapped new swarm %r", self._label, config.swarm_name)
        logger.info("peer %s listens on %s (p2pd pid %s)", self._label, self._visible, self._p2pd_pid)
        neighbours = BackgroundJob("neighbours", self._keep_neighbours, config.rejoin_interval)
        for job in [*jobs, neighbours]:
            self._wake_events[job.name] = asyncio.Event()
            first_after = job.interval if job is neighbours else 0.0  # a peer that just joined has its neighbours
            self._tasks.append(asyncio.create_task(self._repeat(job, first_after)))
        self._tasks.append(asyncio.create_task(self._watchdog()))

    async def _create_node(self, initial_peers: list[str] | None, client_mode: bool) -> DHTNode:
        config = self.config
        node = await DHTNode.create(
            p2p=self._p2p,
            initial_peers=initial_peers,
            record_validator=self._validator,
            client_mode=client_mode,
            wait_timeout=config.wait_timeout,
            bootstrap_timeout=min(config.join_timeout, 2 * config.wait_timeout),
            cache_refresh_before_expiry=0,  # we poll explicitly; no background refresh traffic
            # hivemind's reuse of concurrent lookups keeps an empty entry for every key ever looked up (record keys
            # are named by senders); it only ends early a lookup of a key another finished meanwhile, rare here
            reuse_get_requests=False,
            cache_nearest=config.dht_cache_nearest,
            cache_locally=config.dht_cache_locally,
            num_replicas=config.dht_num_replicas,
            bucket_size=config.dht_bucket_size,
            ensure_bootstrap_success=initial_peers is not None,
        )
        # hivemind keeps every valid value stored here until it expires, however many: bounded in keys and bytes,
        # and in subkeys a key, what goes counted to the host and peer that stored it
        bound_storage(
            node, config.dht_storage_values, config.dht_storage_bytes, current_storer,
            max_subkeys=config.dht_key_subkeys,
            on_subkeys_trimmed=lambda n: self._counters.add("dht_subkeys_trimmed", n),
        )  # fmt: skip
        if self._value_serializer is not None:
            # The protocol reads this attribute at each request: from here on, not during the bootstrap above.
            node.protocol.serializer = self._value_serializer
        if self._store_gate is not None:
            await gate_store_handler(node, functools.partial(self._store_gate.wrap, host_of=self._peer_hosts.host))
        if self._find_gate is not None:  # hivemind answers every key a find names with its whole value, unbounded
            await gate_find_handler(node, functools.partial(self._find_gate.wrap, host_of=self._peer_hosts.host))
        if self._ping_gate is not None:  # each ping of a fresh node id made hivemind loop over every key stored here
            await gate_ping_handler(node, functools.partial(self._ping_gate.wrap, host_of=self._peer_hosts.host))
        if self._routing_guard is not None:  # a libp2p peer goes under one node id; the copy to newcomers is rare
            bound_routing_updates(node, self._routing_guard)
        # and in the answers to this node's lookups too: made-up ids of one peer had it asked again and again
        bound_find_answers(node, self._routing_guard, self._counters)
        return node

    async def become_client(self) -> None:
        """Go on in client mode (for a peer others cannot dial): a new DHT node in client mode on the same p2pd takes
        over, knowing the neighbours the old one knew, and the old one stops answering DHT requests. Others then no
        longer add this peer to their routing tables (an unreachable entry there costs each of them timeouts).
        Runs on the event loop."""
        await self._switch_mode(client_mode=True)

    async def become_server(self) -> None:
        """Go back to server mode (a later reachability check found a neighbour that could dial this peer): the
        reverse of :meth:`become_client`, a new DHT node in server mode on the same p2pd, introduced to the neighbours
        the client one knew. Runs on the event loop."""
        await self._switch_mode(client_mode=False)

    async def _switch_mode(self, client_mode: bool) -> None:
        """Replace the DHT node by one in ``client_mode`` on the same p2pd, introduced to the old one's neighbours;
        nothing if the node is already in that mode."""
        old = self.node
        if old is None or old.protocol.client_mode == client_mode:
            return
        node = await self._create_node(None, client_mode=client_mode)
        neighbours = list(old.protocol.routing_table.peer_id_to_uid)
        await asyncio.gather(*(node.protocol.call_ping(peer_id) for peer_id in neighbours), return_exceptions=True)
        self.node = node
        with contextlib.suppress(Exception):
            await asyncio.wait_for(old.shutdown(), 5)  # removes its DHT handlers; the p2pd is this peer's, it stays

    async def _create_p2p(self) -> P2P:
        """Start p2pd, retrying a refused bootstrap until join_timeout: a busy first peer may answer late."""
        config = self.config
        p2p_kwargs: dict[str, Any] = dict(
            initial_peers=list(config.initial_peers) or None,
            host_maddrs=list(config.host_maddrs),
            announce_maddrs=list(config.announce_maddrs) if config.announce_maddrs else None,
            identity_path=config.identity_path,
            check_if_identity_free=config.check_identity_free,
            use_relay=config.use_relay,
            use_auto_relay=config.use_auto_relay,
            **nat_options(config.host_maddrs, config.nat_traversal),
            dht_mode="client" if config.client_mode else "server",
        )
        deadline = self._clock.monotonic() + config.join_timeout
        started, delay = time.time(), 1.0  # wall time of the socket files, as in start()
        daemon = PubsubP2P if config.gossip else P2P  # announcements need the daemon's pubsub
        while True:
            left = max(1.0, deadline - self._clock.monotonic())
            try:
                # hivemind's own startup_timeout stops the daemon it started when it is not ready in time; create()
                # cancelled from outside would leave it running until its P2P object happened to be collected
                p2p = await asyncio.wait_for(daemon.create(**p2p_kwargs, startup_timeout=left), left + CONNECT_SECONDS)
                remove_stale_sockets_since(started)  # sockets of failed attempts nobody listens on
                return p2p
            except TimeoutError:
                raise SwarmJoinError(self._join_failure_message("timed out starting p2pd")) from None
            except Exception as e:
                if "failed to start in" in str(e):  # hivemind's startup_timeout (it stopped the daemon)
                    raise SwarmJoinError(self._join_failure_message("timed out starting p2pd")) from None
                retry = config.initial_peers and "bootstrap" in str(e) and self._clock.monotonic() + delay < deadline
                if not retry:
                    if config.initial_peers:
                        raise SwarmJoinError(self._join_failure_message(f"{type(e).__name__}: {e}")) from e
                    raise
                logger.info("no initial peer answered yet (%s); retrying in %.0f s", e, delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 8.0)

    def _join_failure_message(self, cause: str) -> str:
        config = self.config
        if not config.initial_peers:
            return (
                f"could not start a new swarm within {config.join_timeout:.0f} s: {cause}. "
                f"Check host_maddrs {config.host_maddrs} (port already in use?) and identity_path."
            )
        peers = ", ".join(config.initial_peers)
        return (
            f"could not join the swarm within {config.join_timeout:.0f} s: no initial peer answered. "
            f"Initial peers: {peers}. Cause: {cause}. Check that the address is right (copy it from the "
            f"first peer's visible_addresses()), that the peer is up and reachable from here (firewall, "
            f"host_maddrs listening on 127.0.0.1 only?), and that the clocks of both machines agree: hivemind "
            f"peers whose clocks differ by more than 3 s fail to interact."
        )

    def _write_state(self) -> None:
        if self.config.state_dir is None or self._p2pd is None:
            return
        state = {
            "python_pid": os.getpid(),
            "p2pd_pid": self._p2pd.pid,
            "p2pd_start": self._p2pd.start,
            "sockets": self._sockets,
        }
        path = os.path.join(self.config.state_dir, STATE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)

    async def _keep_neighbours(self, node: DHTNode) -> None:
        """The neighbours job: keep this peer joined (:meth:`swarm.rejoin.Rejoin.keep`), and bound what hivemind
        remembers of the peers its lookups tried (a made-up peer id named in an answer left a count for good)."""
        trim_ban_counts(node, BAN_COUNTS_KEPT)
        await self._rejoin.keep(self._p2p, node)

    async def _repeat(self, job: BackgroundJob, first_after: float) -> None:
        """Run ``job`` every ``job.interval`` s (or on wakeup) forever; a failure is a counter and a log line."""
        event = self._wake_events[job.name]
        if first_after > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), first_after)
        while True:
            event.clear()  # before the body: a wakeup that arrives during the body is kept for the next round
            try:
                assert self.node is not None
                await job.body(self.node)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._counters.add(f"{job.name}_errors")
                logger.warning("peer %s: %s failed: %s: %s", self._label, job.name, type(e).__name__, e)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), job.interval)

    async def _watchdog(self) -> None:
        """Report p2pd death: hivemind itself fails silently when its daemon dies under a live node."""
        while True:
            await asyncio.sleep(self.config.health_interval)
            child = daemon_process(self._p2p) if self._p2p is not None else None
            dead = child is not None and child.returncode is not None
            if not dead and self._p2pd is not None and not self._p2pd.running():
                dead = True
            if dead and self._healthy:
                self._healthy = False
                self._counters.add("p2pd_deaths")
                logger.error(
                    "peer %s: p2pd (pid %s) died with code %s; this peer can no longer publish or fetch. "
                    "Close it and start a new transport.",
                    self._label,
                    self._p2pd_pid,
                    child.returncode if child is not None else None,
                )

    async def _shutdown(self) -> None:
        for hook in self._before_shutdown:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(hook(), 5)
        await cancel_until_done(self._tasks, timeout=5)
        child = daemon_process(self._p2p) if self._p2p is not None else None
        if self.node is not None and child is not None and child.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.node.shutdown(), 5)
        elif self.node is not None:
            self.node.is_alive = False  # p2pd is gone: a graceful shutdown would wait on it in vain
        if self._p2p is not None:
            await close_p2p(self._p2p)
        # hivemind leaves fire-and-forget tasks (traversals, pings); cancel them so the loop closes cleanly
        await cancel_until_done([t for t in asyncio.all_tasks() if t is not asyncio.current_task()], timeout=2)

    def _stop_thread(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=timeout)
        if not self._thread.is_alive():
            close_stopped_loop(self._loop)

    def _kill_leftovers(self) -> None:
        """Last resort after shutdown: kill our p2pd if it survived, remove our sockets and state file."""
        daemon = self._p2pd
        if daemon is not None and daemon.running() and is_p2pd(daemon.pid) and parent_pid(daemon.pid) == os.getpid():
            daemon.kill()
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(daemon.pid, 0)
        remove_files(self._sockets)
        if self.config.state_dir is not None:
            remove_files([os.path.join(self.config.state_dir, STATE_FILE)])
