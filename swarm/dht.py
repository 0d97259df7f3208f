"""hivemind DHT transport of the swarm: bootstrap and join, signed publish, background fetch, cleanup.

:class:`DHTSwarm` runs one hivemind :class:`~hivemind.dht.node.DHTNode` (and its ``p2pd`` daemon) on an
asyncio event loop in a background thread of this process. Every public method is synchronous,
thread-safe and never waits on the network: :meth:`DHTSwarm.publish` queues, :meth:`DHTSwarm.fetch`
takes groups from a local cache that a background poller keeps filled.

Layout in the DHT (all values are msgpack bytes of :mod:`swarm.records`, owner-signed):

- ``f"{swarm_name}/records/{sender}/{seq}"``: one :class:`~swarm.records.GroupRecord` (the groups of
  one publish call) under subkey = the owner marker ``[owner:<public key>]`` of the sender;
- ``f"{swarm_name}/index/{shard}"``: a small dictionary, one subkey per peer (its owner marker) holding
  its :class:`~swarm.records.IndexEntry` (model name, last few record references); ``shard`` comes from
  a hash of the sender, so no key carries everyone's payload.

A reader polls the index, picks unseen fresh references of other peers at random across peers and
fetches only as many records as keep about ``prefetch_groups`` groups cached: a fetch costs O(J).

Traps of hivemind 1.1.12 this module works around:

- ``hivemind.DHT`` (process-based) breaks its pipe on values over ~16 KiB: we drive ``DHTNode``
  directly;
- one lookup RPC carries all requested keys in one message capped at 4 MiB: records are read at most
  three keys per ``get_many`` (hivemind then sends one key per RPC), and records are capped below that;
- ``store()`` may report success for a value nobody can read back: sizes are enforced before storing;
- if ``p2pd`` dies, hivemind fails silently: a watchdog reports it (:meth:`DHTSwarm.healthy`);
- a failed bootstrap leaves its ``p2pd`` (DHTNode) or its socket file (p2pd exit) behind: we create
  the :class:`~hivemind.p2p.P2P` ourselves and clean both up;
- a frozen peer costs each lookup 3-9 s before it is blacklisted: all network work runs in the
  background thread.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import random
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.p2p import P2P, PeerID
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr

from swarm.daemon import (
    STATE_FILE,
    cleanup_stale_state,
    close_p2p,
    is_p2pd,
    parent_pid,
    pid_alive,
    remove_files,
    remove_stale_sockets_since,
)
from swarm.records import (
    Group,
    GroupRecord,
    IndexEntry,
    ReceivedGroup,
    RecordLimits,
    RecordRef,
    RecordRejected,
    decode_index_entry,
    decode_record,
    encode_index_entry,
    encode_record,
)
from swarm.transport import PeerInfo, SwarmCounters, SwarmTransport
from swarm.validation import (
    RejectionLog,
    fingerprint,
    index_keys,
    make_record_validator,
    owner_marker,
    owner_public_key,
)

logger = logging.getLogger("swarm.dht")

MULTIADDR_FORM = "/ip4/1.2.3.4/tcp/31337/p2p/Qm..."
"""The shape of a joinable multiaddr, shown in error messages."""

_RECORDS_PER_GET = 3  # hivemind packs sqrt(n) keys per lookup RPC: n <= 3 keeps one record per 4 MiB message


class SwarmJoinError(RuntimeError):
    """No initial peer answered while joining a swarm (or the local daemon could not start)."""


@dataclass
class DHTSwarmConfig:
    """Settings of a :class:`DHTSwarm` peer.

    Parameters:
        > Swarm membership

        swarm_name (`str`, defaults to `"sapo"`):
            Prefix of every DHT key; peers with different names ignore each other's records.
        initial_peers (`list[str]`, defaults to `[]`):
            Multiaddrs of peers to join, e.g. `/ip4/1.2.3.4/tcp/31337/p2p/Qm...`. Empty: start a new swarm.
        host_maddrs (`list[str]`, defaults to `["/ip4/127.0.0.1/tcp/0"]`):
            Multiaddrs to listen on. Use `/ip4/0.0.0.0/tcp/31337` to accept peers from other machines.
        announce_maddrs (`list[str]` or `None`, defaults to `None`):
            Multiaddrs other peers should dial (e.g. a public IP behind port forwarding); explicit ports only.
        identity_path (`str` or `None`, defaults to `None`):
            File with the libp2p identity (created if missing) so that the peer id survives restarts. The
            record signing key is kept next to it (see `signing_key_path`). `None`: a fresh identity.
        signing_key_path (`str` or `None`, defaults to `None`):
            PEM file (mode 0600) of the RSA key that signs records; other peers see this peer as a
            fingerprint of it. `None`: `identity_path + ".signing.pem"`, or a fresh key without
            `identity_path`.
        check_identity_free (`bool`, defaults to `True`):
            When joining with an existing identity file, check first that no other peer uses it.
        client_mode (`bool`, defaults to `False`):
            Do not serve DHT requests (for peers others cannot dial); the peer still publishes and fetches.
        use_relay (`bool`, defaults to `True`):
            Allow reaching peers behind NAT through libp2p circuit relays.
        use_auto_relay (`bool`, defaults to `False`):
            Look for relays to become reachable when this peer is behind NAT.
        join_timeout (`float`, defaults to `30.0`):
            Seconds the constructor may spend starting the daemon and contacting initial peers.
        wait_timeout (`float`, defaults to `3.0`):
            Seconds hivemind waits for one RPC answer before it deems the peer unresponsive.

        > Records

        model_name (`str`, defaults to `""`):
            Model name advertised in the index.
        limits (`RecordLimits`, defaults to `RecordLimits()`):
            Size limits enforced on published and received records.
        record_ttl (`float`, defaults to `600.0`):
            Seconds a published record (and index entry) lives in the DHT. Records stored here to live longer
            (by more than a minute plus the clock tolerance) are refused as `ttl_too_long`, so every peer of a
            swarm should use the same value.
        index_shards (`int`, defaults to `8`):
            Number of index keys; every peer of a swarm must use the same value.
        index_records (`int`, defaults to `8`):
            Record references a peer keeps in its index entry (at most `limits.max_index_records`).
        max_pending_publishes (`int`, defaults to `16`):
            Records waiting to be stored; when full, the oldest is dropped and counted (`publish_dropped`).
        store_timeout (`float`, defaults to `30.0`):
            Seconds one background store may take before it counts as a failure.
        announce (`bool`, defaults to `True`):
            Store this peer's index entry on joining and every `announce_interval` seconds without publications,
            so that others list it before its first records. A peer that only relays (a bootstrap peer) sets
            `False` and stays unlisted.
        announce_interval (`float`, defaults to `60.0`):
            A peer that published nothing for this many seconds stores its index entry again, so that others
            list it in :meth:`DHTSwarm.peers` while it loads or generates; it also announces itself on joining.

        > Fetching

        prefetch_groups (`int`, defaults to `16`):
            Groups of other peers the background poller keeps cached for :meth:`DHTSwarm.fetch`; set it
            to about J (external groups per step) times two.
        max_cached_groups (`int`, defaults to `256`):
            Cap of the cache; the oldest groups are dropped beyond it.
        poll_interval (`float`, defaults to `1.0`):
            Seconds between two background polls.
        index_refresh_interval (`float`, defaults to `10.0`):
            Read the index at least this often even when the cache is full (keeps :meth:`peers` current).
        index_min_interval (`float`, defaults to `2.0`):
            Read the index at most this often; in between, the poller fetches records it already knows of.
        index_shards_per_poll (`int`, defaults to `2`):
            Index shards read per poll, in rotation (`0`: all). Each shard holds about N / `index_shards`
            peers, so a poll costs O(J), not O(N), once the swarm is large.
        index_staleness (`float`, defaults to `5.0`):
            A copy of an index shard updated less than this many seconds ago ends the lookup; older copies
            (e.g. this node's own cache) make hivemind search further replicas.
        rejoin_interval (`float`, defaults to `10.0`):
            Seconds between two checks of this peer's DHT neighbours. A peer that has lost all of them (its link
            was down, or every neighbour left) dials and pings the peers it knew, initial peers included, to
            rejoin (counted as `rejoin_attempts` and `rejoins`).
        fetch_timeout (`float`, defaults to `20.0`):
            Seconds one background lookup may take.
        clock_skew_tolerance (`float`, defaults to `3.0`):
            Records created further in the future are rejected as `clock_skew`.

        > Process hygiene

        state_dir (`str` or `None`, defaults to `None`):
            Directory for a small state file with the p2pd pid and socket paths, so that the next start
            with the same directory can remove what a killed (`kill -9`) process left behind.
        health_interval (`float`, defaults to `1.0`):
            Seconds between two checks that p2pd is alive.
    """

    swarm_name: str = field(default="sapo", metadata={"help": "Prefix of every DHT key of this swarm."})
    initial_peers: list[str] = field(
        default_factory=list, metadata={"help": "Multiaddrs of peers to join; empty starts a new swarm."}
    )
    host_maddrs: list[str] = field(
        default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"], metadata={"help": "Multiaddrs to listen on."}
    )
    announce_maddrs: list[str] | None = field(
        default=None, metadata={"help": "Multiaddrs other peers should dial (explicit ports)."}
    )
    identity_path: str | None = field(
        default=None, metadata={"help": "libp2p identity file (created if missing): a stable peer id."}
    )
    signing_key_path: str | None = field(
        default=None, metadata={"help": "PEM file of the record signing key; default: identity_path + .signing.pem"}
    )
    check_identity_free: bool = field(
        default=True, metadata={"help": "Check that no other peer uses this identity before joining."}
    )
    client_mode: bool = field(default=False, metadata={"help": "Do not serve DHT requests of other peers."})
    use_relay: bool = field(default=True, metadata={"help": "Reach NATed peers through libp2p relays."})
    use_auto_relay: bool = field(default=False, metadata={"help": "Look for relays when behind NAT."})
    join_timeout: float = field(default=30.0, metadata={"help": "Seconds allowed to start and join."})
    wait_timeout: float = field(default=3.0, metadata={"help": "Seconds hivemind waits for one RPC answer."})
    model_name: str = field(default="", metadata={"help": "Model name advertised in the index."})
    limits: RecordLimits = field(
        default_factory=RecordLimits, metadata={"help": "Size limits of published and received records."}
    )
    record_ttl: float = field(default=600.0, metadata={"help": "Seconds a published record lives in the DHT."})
    index_shards: int = field(default=8, metadata={"help": "Number of index keys (same for the whole swarm)."})
    index_records: int = field(default=8, metadata={"help": "Record references kept in this peer's index entry."})
    max_pending_publishes: int = field(default=16, metadata={"help": "Records waiting to be stored."})
    store_timeout: float = field(default=30.0, metadata={"help": "Seconds one background store may take."})
    announce: bool = field(default=True, metadata={"help": "List this peer in the index before it publishes."})
    announce_interval: float = field(
        default=60.0, metadata={"help": "Seconds without a publication after which the index entry is renewed."}
    )
    prefetch_groups: int = field(default=16, metadata={"help": "Groups of others kept cached for fetch()."})
    max_cached_groups: int = field(default=256, metadata={"help": "Cap of the fetch cache."})
    poll_interval: float = field(default=1.0, metadata={"help": "Seconds between background polls."})
    index_refresh_interval: float = field(default=10.0, metadata={"help": "Read the index at least this often."})
    index_min_interval: float = field(default=2.0, metadata={"help": "Read the index at most this often."})
    index_shards_per_poll: int = field(default=2, metadata={"help": "Index shards read per poll (0: all)."})
    index_staleness: float = field(default=5.0, metadata={"help": "Accept an index copy updated this recently."})
    rejoin_interval: float = field(default=10.0, metadata={"help": "Seconds between two neighbour checks."})
    fetch_timeout: float = field(default=20.0, metadata={"help": "Seconds one background lookup may take."})
    clock_skew_tolerance: float = field(default=3.0, metadata={"help": "Seconds a record may be in the future."})
    state_dir: str | None = field(default=None, metadata={"help": "Directory for crash-cleanup state."})
    health_interval: float = field(default=1.0, metadata={"help": "Seconds between p2pd liveness checks."})

    def __post_init__(self) -> None:
        if isinstance(self.initial_peers, str):
            self.initial_peers = [self.initial_peers]
        if not 1 <= self.index_records <= self.limits.max_index_records:
            raise ValueError(f"index_records must be in [1, {self.limits.max_index_records}]")
        for name in ("index_shards", "prefetch_groups", "max_cached_groups", "max_pending_publishes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")


def validate_multiaddr(addr: str, require_peer_id: bool) -> Multiaddr:
    """Parse a multiaddr, raising ``ValueError`` that names it and shows the expected form."""
    try:
        maddr = Multiaddr(str(addr))
        if require_peer_id:
            PeerID.from_base58(maddr["p2p"])
        return maddr
    except Exception as e:
        expected = MULTIADDR_FORM if require_peer_id else "/ip4/1.2.3.4/tcp/31337"
        raise ValueError(f"malformed multiaddr {addr!r} ({e}); expected the form {expected}") from None


# ------------------------------------------------------------------------------------------------
# keys, identity and process hygiene


def _load_or_create_signing_key(path: str | None) -> RSAPrivateKey:
    """The RSA signing key stored at ``path`` (PEM, mode 0600), created if missing; fresh if ``path`` is None."""
    if path is None:
        return RSAPrivateKey()
    key = RSAPrivateKey.__new__(RSAPrivateKey)  # the class only knows how to generate; wrap a loaded key
    if os.path.exists(path):
        with open(path, "rb") as f:
            key._private_key = serialization.load_pem_private_key(f.read(), password=None)
        return key
    fresh = RSAPrivateKey()
    pem = fresh._private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return fresh


_LIVE_SWARMS: weakref.WeakSet[DHTSwarm] = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for swarm in list(_LIVE_SWARMS):
        with contextlib.suppress(Exception):
            swarm.close()


# ------------------------------------------------------------------------------------------------
# the transport


@dataclass
class _PeerState:
    public_key: bytes
    model: str
    last_seen: float
    refs: list[RecordRef]


class DHTSwarm(SwarmTransport):
    """One peer of a swarm over the hivemind DHT; see the module docstring for the layout and traps.

    Example:
        >>> first = DHTSwarm(DHTSwarmConfig(model_name="tiny"))
        >>> second = DHTSwarm(DHTSwarmConfig(initial_peers=first.visible_addresses()))
        >>> first.publish(groups); ...; second.fetch(4)

    Raises:
        ValueError: a malformed multiaddr in the config.
        SwarmJoinError: no initial peer answered within ``config.join_timeout``.
    """

    def __init__(self, config: DHTSwarmConfig | None = None, **overrides: Any):
        config = dataclasses.replace(config or DHTSwarmConfig(), **overrides)
        self.config = config
        for addr in config.initial_peers:
            validate_multiaddr(addr, require_peer_id=True)
        for addr in list(config.host_maddrs) + list(config.announce_maddrs or []):
            validate_multiaddr(addr, require_peer_id=False)

        identity_path = config.identity_path
        signing_key_path = config.signing_key_path
        if signing_key_path is None and identity_path is not None:
            signing_key_path = identity_path + ".signing.pem"
        if identity_path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(identity_path)), exist_ok=True)
        self._private_key = _load_or_create_signing_key(signing_key_path)
        self._public_key = self._private_key.get_public_key().to_bytes()
        self._peer_id = fingerprint(self._public_key)

        self._counters = SwarmCounters()
        self._reject = RejectionLog(self._counters)
        self._validator = make_record_validator(
            self._private_key,
            config.swarm_name,
            config.index_shards,
            config.limits,
            self._reject,
            # Peers with a longer record_ttl than ours are refused: storage here stays bounded by our expiry.
            max_ttl=config.record_ttl + config.clock_skew_tolerance + 60.0,
        )
        self._marker = owner_marker(self._public_key)
        self._index_key = index_keys(config.swarm_name, config.index_shards)[
            int(hashlib.sha256(self._peer_id.encode()).hexdigest(), 16) % config.index_shards
        ]

        self._lock = threading.Lock()
        self._pending: collections.deque[tuple[int, bytes, int, float]] = collections.deque()
        self._recent_refs: collections.deque[RecordRef] = collections.deque(maxlen=config.index_records)
        self._next_seq = int(time.time() * 1000)  # ms clock: sequence numbers stay unique across restarts
        self._peers: dict[str, _PeerState] = {}
        self._seen_refs: dict[tuple[str, int], float] = {}  # (sender, seq) -> created_at, pruned after the ttl
        self._missing_tries: collections.Counter[tuple[str, int]] = collections.Counter()
        self._cache: list[ReceivedGroup] = []
        self._returned: collections.OrderedDict[tuple[str, str, float], None] = collections.OrderedDict()
        self._skew_warned: set[str] = set()
        self._timings: dict[str, float] = {}
        self._samples: dict[str, collections.deque[float]] = {}
        self._closed = False
        self._healthy = False
        self._last_index_read = -float("inf")
        self._last_index_store = -float("inf")
        self._last_neighbour_check = time.monotonic()
        self._known_peers: dict[Any, list[Any]] = {}  # libp2p PeerID -> multiaddrs, to rejoin after a partition
        self._alone_since: float | None = None
        self._shard_order = index_keys(config.swarm_name, config.index_shards)
        random.shuffle(self._shard_order)  # peers start their rotation at different shards
        self._shard_cursor = 0
        self._node: DHTNode | None = None
        self._p2p: P2P | None = None
        self._p2pd_pid: int | None = None
        self._sockets: list[str] = []
        self._visible: list[str] = []
        self._tasks: list[asyncio.Task] = []

        self._loop = asyncio.new_event_loop()
        self._publish_event: asyncio.Event | None = None
        self._poll_event: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run_loop, name=f"swarm-dht-{self._peer_id}", daemon=True)
        self._thread.start()
        started = time.time()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        try:
            future.result(timeout=config.join_timeout + 10)
        except BaseException as e:
            future.cancel()
            self._stop_thread()
            self._kill_leftovers()
            remove_stale_sockets_since(started)
            time.sleep(0.5)  # a p2pd that failed its start may still hold its socket for a moment
            remove_stale_sockets_since(started)
            if isinstance(e, SwarmJoinError | ValueError):
                raise
            raise SwarmJoinError(self._join_failure_message(f"{type(e).__name__}: {e}")) from e
        _LIVE_SWARMS.add(self)

    # -------------------------------------------------------------------------------- lifecycle

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(self._loop_exception)
        self._loop.run_forever()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # hivemind leaves fire-and-forget tasks whose errors (mostly lost connections to peers that left)
        # nobody retrieves; they are expected in a swarm, so they go to the debug log, not stderr.
        self._counters.add("loop_errors")
        logger.debug(
            "peer %s: background error: %s %r", self._peer_id, context.get("message"), context.get("exception")
        )

    def _join_failure_message(self, cause: str) -> str:
        if not self.config.initial_peers:
            return (
                f"could not start a new swarm within {self.config.join_timeout:.0f} s: {cause}. "
                f"Check host_maddrs {self.config.host_maddrs} (port already in use?) and identity_path."
            )
        peers = ", ".join(self.config.initial_peers)
        return (
            f"could not join the swarm within {self.config.join_timeout:.0f} s: no initial peer answered. "
            f"Initial peers: {peers}. Cause: {cause}. Check that the address is right (copy it from the "
            f"first peer's visible_addresses()), that the peer is up and reachable from here (firewall, "
            f"host_maddrs listening on 127.0.0.1 only?), and that the clocks of both machines agree: hivemind "
            f"peers whose clocks differ by more than 3 s fail to interact."
        )

    async def _start(self) -> None:
        config = self.config
        if config.state_dir is not None:
            os.makedirs(config.state_dir, exist_ok=True)
            cleanup_stale_state(config.state_dir)
        self._publish_event, self._poll_event = asyncio.Event(), asyncio.Event()
        p2p_kwargs: dict[str, Any] = dict(
            initial_peers=list(config.initial_peers) or None,
            host_maddrs=list(config.host_maddrs),
            announce_maddrs=list(config.announce_maddrs) if config.announce_maddrs else None,
            identity_path=config.identity_path,
            check_if_identity_free=config.check_identity_free,
            use_relay=config.use_relay,
            use_auto_relay=config.use_auto_relay,
            dht_mode="client" if config.client_mode else "server",
        )
        self._p2p = await self._create_p2p(p2p_kwargs)
        self._p2pd_pid = self._p2p._child.pid if self._p2p._child is not None else None
        self._sockets = [self._p2p._daemon_listen_maddr["unix"], self._p2p._client_listen_maddr["unix"]]
        self._write_state()
        try:
            self._node = await asyncio.wait_for(
                DHTNode.create(
                    p2p=self._p2p,
                    initial_peers=list(config.initial_peers) or None,
                    record_validator=self._validator,
                    client_mode=config.client_mode,
                    wait_timeout=config.wait_timeout,
                    bootstrap_timeout=min(config.join_timeout, 2 * config.wait_timeout),
                    cache_refresh_before_expiry=0,  # we poll explicitly; no background refresh traffic
                    ensure_bootstrap_success=True,
                ),
                config.join_timeout,
            )
        except BaseException as e:
            await self._shutdown_p2p()
            if isinstance(e, asyncio.TimeoutError):
                raise SwarmJoinError(self._join_failure_message("timed out bootstrapping the DHT")) from None
            raise SwarmJoinError(self._join_failure_message(f"{type(e).__name__}: {e}")) from e
        self._visible = [str(m) for m in await self._p2p.get_visible_maddrs()]
        for addr in config.initial_peers:
            maddr = Multiaddr(addr)
            self._known_peers[PeerID.from_base58(maddr["p2p"])] = [maddr.decapsulate(Multiaddr(f"/p2p/{maddr['p2p']}"))]
        self._healthy = True
        if config.initial_peers:
            logger.info("peer %s joined swarm %r via %s", self._peer_id, config.swarm_name, config.initial_peers)
        else:
            logger.info("peer %s bootstrapped new swarm %r", self._peer_id, config.swarm_name)
        logger.info("peer %s listens on %s (p2pd pid %s)", self._peer_id, self._visible, self._p2pd_pid)
        for coro in (self._publisher(), self._poller(), self._watchdog()):
            self._tasks.append(asyncio.create_task(coro))

    async def _create_p2p(self, p2p_kwargs: dict[str, Any]) -> P2P:
        """Start p2pd, retrying a refused bootstrap until join_timeout: a busy first peer may answer late."""
        config = self.config
        deadline = time.monotonic() + config.join_timeout
        started, delay = time.time(), 1.0
        while True:
            try:
                # We create the P2P ourselves (not DHTNode) so that a failed bootstrap can shut it down.
                p2p = await asyncio.wait_for(P2P.create(**p2p_kwargs), max(1.0, deadline - time.monotonic()))
                remove_stale_sockets_since(started)  # sockets of failed attempts nobody listens on
                return p2p
            except asyncio.TimeoutError:
                raise SwarmJoinError(self._join_failure_message("timed out starting p2pd")) from None
            except Exception as e:
                retry = config.initial_peers and "bootstrap" in str(e) and time.monotonic() + delay < deadline
                if not retry:
                    if config.initial_peers:
                        raise SwarmJoinError(self._join_failure_message(f"{type(e).__name__}: {e}")) from e
                    raise
                logger.info("no initial peer answered yet (%s); retrying in %.0f s", e, delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 8.0)

    def _write_state(self) -> None:
        if self.config.state_dir is None or self._p2pd_pid is None:
            return
        state = {"python_pid": os.getpid(), "p2pd_pid": self._p2pd_pid, "sockets": self._sockets}
        path = os.path.join(self.config.state_dir, STATE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)

    async def _shutdown_p2p(self) -> None:
        if self._p2p is not None:
            await close_p2p(self._p2p)

    async def _shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        child = self._p2p._child if self._p2p is not None else None
        if self._node is not None and child is not None and child.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._node.shutdown(), 5)
        elif self._node is not None:
            self._node.is_alive = False  # p2pd is gone: a graceful shutdown would wait on it in vain
        await self._shutdown_p2p()
        # hivemind leaves fire-and-forget tasks (traversals, pings); cancel them so the loop closes cleanly
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.wait(others, timeout=2) if others else None

    def _stop_thread(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._loop.close()

    def _kill_leftovers(self) -> None:
        """Last resort after shutdown: kill our p2pd if it survived, remove our sockets and state file."""
        pid = self._p2pd_pid
        if pid is not None and pid_alive(pid) and is_p2pd(pid) and parent_pid(pid) == os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)
        remove_files(self._sockets)
        if self.config.state_dir is not None:
            remove_files([os.path.join(self.config.state_dir, STATE_FILE)])

    def close(self) -> None:
        """Leave the swarm: stop the background work, shut down the DHT node and p2pd, remove socket files.

        Blocks until done (bounded by internal timeouts); calling it again does nothing.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _LIVE_SWARMS.discard(self)
        if self._thread.is_alive() and not self._loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            with contextlib.suppress(Exception):
                future.result(timeout=30)
        self._stop_thread()
        self._kill_leftovers()
        self._healthy = False
        logger.info("peer %s left swarm %r", self._peer_id, self.config.swarm_name)

    # -------------------------------------------------------------------------------- public API

    @property
    def peer_id(self) -> str:
        """Fingerprint of this peer's signing key: what others see as :attr:`ReceivedGroup.sender`."""
        return self._peer_id

    @property
    def p2pd_pid(self) -> int | None:
        """Process id of this peer's p2pd daemon."""
        return self._p2pd_pid

    @property
    def socket_paths(self) -> list[str]:
        """Unix socket files of this peer's p2pd and its client."""
        return list(self._sockets)

    def visible_addresses(self) -> list[str]:
        """Multiaddrs (with ``/p2p/<peer id>``) that other peers pass as ``initial_peers`` to join."""
        return list(self._visible)

    def publish(self, groups: Sequence[Group]) -> None:
        """Queue ``groups`` as one record and return at once; the background thread stores it.

        Raises:
            RecordRejected: the groups break this peer's own limits (e.g. ``too_large``).
            RuntimeError: the transport is closed.
        """
        if self._closed:
            raise RuntimeError(f"DHTSwarm of peer {self._peer_id} is closed")
        if not groups:
            return
        now = time.time()
        data = encode_record(GroupRecord(groups=list(groups), created_at=now), self.config.limits)
        with self._lock:
            seq = self._next_seq = max(self._next_seq + 1, int(now * 1000))
            if len(self._pending) >= self.config.max_pending_publishes:
                self._pending.popleft()
                self._counters.add("publish_dropped")
            self._pending.append((seq, data, len(groups), now))
        self._counters.add("queued_records")
        self._wake("_publish_event")

    def _wake(self, event: str) -> None:
        """Wake a background task from any thread (a closed loop is ignored)."""

        def set_event() -> None:
            if getattr(self, event) is not None:
                getattr(self, event).set()

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(set_event)

    def fetch(self, max_groups: int, max_age: float | None = None) -> list[ReceivedGroup]:
        """Take up to ``max_groups`` cached groups of other peers, never returned before; never blocks.

        ``max_age`` (seconds, by :attr:`Group.created_at`) drops older groups (counted as ``expired``).
        """
        if max_groups <= 0 or self._closed:
            return []
        now = time.time()
        with self._lock:
            fresh = []
            for item in self._cache:
                if max_age is not None and now - item.group.created_at > max_age:
                    self._counters.reject("expired")
                else:
                    fresh.append(item)
            random.shuffle(fresh)
            taken, self._cache = fresh[:max_groups], fresh[max_groups:]
            for item in taken:
                self._returned[(item.sender, item.group.group_id, item.group.created_at)] = None
            while len(self._returned) > 100_000:
                self._returned.popitem(last=False)
        self._counters.add("fetched_groups", len(taken))
        if len(taken) < max_groups:
            self._wake("_poll_event")  # refill early
        return taken

    def peers(self) -> list[PeerInfo]:
        """Other peers whose index entries were seen within the record ttl."""
        horizon = time.time() - self.config.record_ttl
        with self._lock:
            return [
                PeerInfo(peer=peer, model=state.model, last_seen=state.last_seen)
                for peer, state in self._peers.items()
                if state.last_seen >= horizon
            ]

    def counters(self) -> dict[str, int]:
        """Counters: published_records/groups, publish_failures, fetched_records/groups, index_reads, rejected/*."""
        return self._counters.snapshot()

    def stats(self) -> dict[str, Any]:
        """Counters plus the latest background timings (seconds) and cache size, for benchmarks."""
        with self._lock:
            out: dict[str, Any] = dict(self._timings)
            out["cached_groups"] = len(self._cache)
        out["counters"] = self.counters()
        out["healthy"] = self.healthy()
        return out

    def timing_samples(self) -> dict[str, list[float]]:
        """Durations (seconds) of recent background stores, index reads and record lookups; clears them."""
        with self._lock:
            samples = {name: list(values) for name, values in self._samples.items()}
            self._samples.clear()
        return samples

    def _record_timing(self, name: str, seconds: float) -> None:
        with self._lock:
            self._timings[f"last_{name}_seconds"] = seconds
            self._samples.setdefault(name, collections.deque(maxlen=1000)).append(seconds)

    def healthy(self) -> bool:
        """False once closed, or if p2pd or the background thread died (the peer then neither sends nor gets)."""
        return self._healthy and not self._closed and self._thread.is_alive()

    def status(self) -> dict[str, Any]:
        """A summary for logs and health endpoints."""
        return {
            "peer_id": self._peer_id,
            "healthy": self.healthy(),
            "p2pd_pid": self._p2pd_pid,
            "addresses": self.visible_addresses(),
            "peers": len(self.peers()),
            "cached_groups": len(self._cache),
        }

    def gauges(self) -> dict[str, float]:
        """What this peer holds now: DHT items stored here, cached groups, refs and peers remembered."""
        node = self._node
        stored = len(node.protocol.storage) if node is not None else 0
        with self._lock:
            return {
                "dht_stored_items": float(stored),
                "cached_groups": float(len(self._cache)),
                "seen_refs": float(len(self._seen_refs)),
                "known_senders": float(len(self._peers)),
                "returned_ids": float(len(self._returned)),
            }

    # -------------------------------------------------------------------------------- background

    async def _guarded(self, name: str, body: Any, interval: float, event: asyncio.Event) -> None:
        """Run ``body()`` every ``interval`` s (or on wakeup) forever; a failure is a counter + log line."""
        while True:
            event.clear()  # before the body: a wakeup that arrives during the body is kept for the next round
            try:
                await body()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._counters.add(f"{name}_errors")
                logger.warning("peer %s: %s failed: %s: %s", self._peer_id, name, type(e).__name__, e)
            try:
                await asyncio.wait_for(event.wait(), interval)
            except asyncio.TimeoutError:
                pass

    async def _publisher(self) -> None:
        assert self._publish_event is not None
        await self._guarded("publish", self._publish_pending, self.config.poll_interval, self._publish_event)

    async def _poller(self) -> None:
        assert self._poll_event is not None
        await self._guarded("poll", self._poll_once, self.config.poll_interval, self._poll_event)

    async def _publish_pending(self) -> None:
        while True:
            with self._lock:
                batch = list(self._pending)
                self._pending.clear()
            if not batch:
                if self.config.announce and time.monotonic() - self._last_index_store >= self.config.announce_interval:
                    await self._store_batch([])  # the index entry alone: "this peer is here"
                return
            await self._store_batch(batch)

    async def _store_batch(self, batch: list[tuple[int, bytes, int, float]]) -> None:
        config, node = self.config, self._node
        assert node is not None
        for seq, _, num_groups, created_at in batch:
            self._recent_refs.append(RecordRef(seq=seq, created_at=created_at, num_groups=num_groups))
        now = time.time()
        entry = IndexEntry(model=config.model_name, records=list(self._recent_refs), updated_at=now)
        index_bytes = encode_index_entry(entry, config.limits)
        keys = [self._record_key(self._peer_id, seq) for seq, *_ in batch] + [self._index_key]
        values = [data for _, data, *_ in batch] + [index_bytes]
        expiration = now + config.record_ttl
        started = time.perf_counter()
        self._last_index_store = time.monotonic()
        try:
            result = await asyncio.wait_for(
                node.store_many(keys, values, expiration, subkeys=[self._marker] * len(keys)), config.store_timeout
            )
        except asyncio.TimeoutError:
            result = {}
            self._counters.add("store_timeouts")
            logger.warning("peer %s: storing %d record(s) timed out", self._peer_id, len(batch))
        self._record_timing("publish", time.perf_counter() - started)
        for key, (_, data, num_groups, _) in zip(keys, batch, strict=False):  # keys ends with the index key
            if result.get((key, self._marker)):
                self._counters.add("published_records")
                self._counters.add("published_groups", num_groups)
                self._counters.add("published_bytes", len(data))
            else:
                self._counters.add("publish_failures")
        if not result.get((self._index_key, self._marker)):
            self._counters.add("index_store_failures")

    def _record_key(self, sender: str, seq: int) -> str:
        return f"{self.config.swarm_name}/records/{sender}/{seq}"

    async def _poll_once(self) -> None:
        if time.monotonic() - self._last_neighbour_check >= self.config.rejoin_interval:
            self._last_neighbour_check = time.monotonic()
            self._forget_expired()
            await self._keep_neighbours()
        with self._lock:
            need = self.config.prefetch_groups - len(self._cache)
        since = time.monotonic() - self._last_index_read
        if since >= self.config.index_refresh_interval or (need > 0 and since >= self.config.index_min_interval):
            self._last_index_read = time.monotonic()
            await self._read_index()
        if need > 0:
            await self._fetch_records(self._choose_refs(need))

    def _forget_expired(self) -> None:
        """Drop bookkeeping about records and peers older than the record ttl, so a long-running peer's memory
        stays bounded: expired refs are never chosen again, and a peer silent that long is not listed."""
        horizon = time.time() - self.config.record_ttl - self.config.clock_skew_tolerance
        with self._lock:
            for ref in [ref for ref, created_at in self._seen_refs.items() if created_at < horizon]:
                del self._seen_refs[ref]
            for sender in [sender for sender, state in self._peers.items() if state.last_seen < horizon]:
                del self._peers[sender]

    async def _keep_neighbours(self) -> None:
        """Remember how to reach the peers connected now; rejoin through them once none is left.

        hivemind drops a neighbour from the routing table when it stops answering and never looks again, so
        after a network partition a peer would stay alone for good.
        """
        node, p2p = self._node, self._p2p
        assert node is not None and p2p is not None
        for info in await asyncio.wait_for(p2p.list_peers(), self.config.wait_timeout):
            if info.addrs:
                self._known_peers[info.peer_id] = list(info.addrs)
        while len(self._known_peers) > 64:  # the oldest entries go first
            self._known_peers.pop(next(iter(self._known_peers)))
        if node.protocol.routing_table.peer_id_to_uid or not self._known_peers:
            self._alone_since = None
            return
        self._counters.add("rejoin_attempts")
        if self._alone_since is None:  # warn once per partition, not at every attempt
            self._alone_since = time.monotonic()
            logger.warning(
                "peer %s has no DHT neighbour left (network down, or every neighbour left); trying to rejoin "
                "through %d known peer(s) every %.0f s", self._peer_id, len(self._known_peers),
                self.config.rejoin_interval,
            )  # fmt: skip

        async def dial_and_ping(peer_id: Any, addrs: list[Any]) -> Any:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p2p._client.connect(peer_id, addrs), self.config.wait_timeout)
            return await node.protocol.call_ping(peer_id)

        answers = await asyncio.gather(
            *(dial_and_ping(peer_id, addrs) for peer_id, addrs in self._known_peers.items()), return_exceptions=True
        )
        if any(isinstance(answer, DHTID) for answer in answers):
            await asyncio.wait_for(node.find_nearest_nodes([node.node_id]), self.config.fetch_timeout)
            self._counters.add("rejoins")
            neighbours = len(node.protocol.routing_table.peer_id_to_uid)
            alone = time.monotonic() - (self._alone_since or time.monotonic())
            logger.info(
                "peer %s rejoined the swarm after %.0f s alone (%d neighbour(s))", self._peer_id, alone, neighbours
            )
            self._alone_since = None

    async def _read_index(self) -> None:
        config, node = self.config, self._node
        assert node is not None
        started = time.perf_counter()
        count = config.index_shards_per_poll or config.index_shards
        if count >= config.index_shards:
            shard_keys = self._shard_order
        else:
            shard_keys = [self._shard_order[(self._shard_cursor + i) % config.index_shards] for i in range(count)]
            self._shard_cursor = (self._shard_cursor + count) % config.index_shards
        # A shard's expiration is that of its newest entry (written with now + ttl): asking for a copy updated
        # within index_staleness skips stale copies (our own cache included) without traversing every replica.
        sufficient = time.time() + config.record_ttl - config.index_staleness
        results = await asyncio.wait_for(
            node.get_many(shard_keys, sufficient_expiration_time=sufficient), config.fetch_timeout
        )
        self._counters.add("index_reads")
        self._record_timing("index", time.perf_counter() - started)
        now = time.time()
        for found in results.values():
            if found is None or not isinstance(found.value, dict):
                continue
            for subkey, item in found.value.items():
                public_key = owner_public_key(subkey)
                if public_key is None or public_key == self._public_key:
                    continue
                sender = fingerprint(public_key)
                try:
                    entry = decode_index_entry(item.value, config.limits)
                except RecordRejected as e:
                    self._reject(e.reason, f"index entry of {sender}: {e.detail}")
                    continue
                if entry.updated_at > now + config.clock_skew_tolerance:
                    self._clock_skew(sender, entry.updated_at - now)
                    continue
                with self._lock:
                    state = self._peers.get(sender)
                    if state is None:
                        logger.info("peer %s found peer %s (model %r)", self._peer_id, sender, entry.model)
                    if state is None or entry.updated_at >= state.last_seen:
                        self._peers[sender] = _PeerState(public_key, entry.model, entry.updated_at, entry.records)

    def _clock_skew(self, sender: str, ahead: float) -> None:
        self._reject("clock_skew", f"peer {sender} is {ahead:.1f} s in the future")
        if sender not in self._skew_warned:
            self._skew_warned.add(sender)
            logger.warning(
                "peer %s: records of peer %s are dated %.1f s in the future: the clocks of the two machines "
                "differ (hivemind peers whose clocks differ by more than 3 s fail to interact); sync them (NTP)",
                self._peer_id,
                sender,
                ahead,
            )

    def _choose_refs(self, need: int) -> list[tuple[str, RecordRef]]:
        """Unseen fresh refs of other peers, newest first per peer, round-robin over peers in random order."""
        now = time.time()
        oldest = now - self.config.record_ttl
        with self._lock:
            per_peer = {
                sender: sorted(
                    (
                        ref
                        for ref in state.refs
                        if (sender, ref.seq) not in self._seen_refs
                        and oldest <= ref.created_at <= now + self.config.clock_skew_tolerance
                    ),
                    key=lambda ref: -ref.created_at,
                )
                for sender, state in self._peers.items()
            }
        order = [sender for sender, refs in per_peer.items() if refs]
        random.shuffle(order)
        chosen: list[tuple[str, RecordRef]] = []
        expected = 0
        while order and expected < need:
            for sender in list(order):
                ref = per_peer[sender].pop(0)
                chosen.append((sender, ref))
                expected += max(1, ref.num_groups)
                if not per_peer[sender]:
                    order.remove(sender)
                if expected >= need:
                    break
        return chosen

    async def _fetch_records(self, chosen: list[tuple[str, RecordRef]]) -> None:
        if not chosen:
            return
        config, node = self.config, self._node
        assert node is not None
        started = time.perf_counter()
        keys = {self._record_key(sender, ref.seq): (sender, ref) for sender, ref in chosen}
        chunks = [list(keys)[i : i + _RECORDS_PER_GET] for i in range(0, len(keys), _RECORDS_PER_GET)]
        outcomes = await asyncio.gather(
            *(asyncio.wait_for(node.get_many(chunk), config.fetch_timeout) for chunk in chunks),
            return_exceptions=True,
        )
        results: dict[str, Any] = {}
        for chunk, outcome in zip(chunks, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self._counters.add("fetch_failures")
                logger.debug("peer %s: record lookup failed: %r", self._peer_id, outcome)
                outcome = dict.fromkeys(chunk)
            results.update(outcome)
        self._record_timing("fetch", time.perf_counter() - started)
        for key, found in results.items():
            sender, ref = keys[key]
            self._take_record(sender, ref, found)

    def _take_record(self, sender: str, ref: RecordRef, found: Any) -> None:
        config = self.config
        with self._lock:
            state = self._peers.get(sender)
        if state is None:
            return
        if found is None or not isinstance(found.value, dict):
            # Not there yet (store still travelling) or lost: retry a few polls, then give up on it.
            self._missing_tries[(sender, ref.seq)] += 1
            if self._missing_tries[(sender, ref.seq)] >= 3:
                del self._missing_tries[(sender, ref.seq)]
                self._seen_refs[(sender, ref.seq)] = ref.created_at
                self._counters.add("records_missing")
            return
        self._seen_refs[(sender, ref.seq)] = ref.created_at
        self._missing_tries.pop((sender, ref.seq), None)
        expected_subkey = owner_marker(state.public_key)
        value = None
        for subkey, item in found.value.items():
            if subkey == expected_subkey:
                value = item.value
            else:  # someone else wrote under this peer's records key: signed, but not by the owner
                self._reject("bad_signature", f"foreign subkey under the records key of {sender}")
        if value is None:
            self._counters.add("records_missing")
            return
        self._counters.add("fetched_bytes", len(value) if isinstance(value, bytes) else 0)
        try:
            record = decode_record(value, config.limits)
        except RecordRejected as e:
            self._reject(e.reason, f"record of {sender}: {e.detail}")
            return
        now = time.time()
        if record.created_at > now + config.clock_skew_tolerance:
            self._clock_skew(sender, record.created_at - now)
            return
        self._counters.add("fetched_records")
        accepted = []
        for group in record.groups:
            if group.created_at > now + config.clock_skew_tolerance:
                self._clock_skew(sender, group.created_at - now)
            elif now - group.created_at > config.record_ttl:
                self._reject("expired", f"group of {sender} is {now - group.created_at:.0f} s old")
            else:
                accepted.append(ReceivedGroup(sender=sender, group=group))
        with self._lock:
            for item in accepted:
                if (item.sender, item.group.group_id, item.group.created_at) not in self._returned:
                    self._cache.append(item)
            if len(self._cache) > config.max_cached_groups:
                self._cache.sort(key=lambda item: item.group.created_at)
                del self._cache[: len(self._cache) - config.max_cached_groups]
        self._counters.add("received_groups", len(accepted))

    async def _watchdog(self) -> None:
        """Report p2pd death: hivemind itself fails silently when its daemon dies under a live node."""
        while True:
            await asyncio.sleep(self.config.health_interval)
            child = self._p2p._child if self._p2p is not None else None
            dead = child is not None and child.returncode is not None
            if not dead and self._p2pd_pid is not None and not pid_alive(self._p2pd_pid):
                dead = True
            if dead and self._healthy:
                self._healthy = False
                self._counters.add("p2pd_deaths")
                logger.error(
                    "peer %s: p2pd (pid %s) died with code %s; this peer can no longer publish or fetch. "
                    "Close it and start a new DHTSwarm.",
                    self._peer_id,
                    self._p2pd_pid,
                    child.returncode if child is not None else None,
                )
