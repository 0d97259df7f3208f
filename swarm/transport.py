"""The interface every swarm transport implements, and the counters it keeps."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.records import Group, ReceivedGroup


@dataclass(frozen=True)
class PeerInfo:
    """A peer this transport has seen in the swarm index.

    Parameters:
        peer (`str`): the peer's verified identity (a fingerprint of its signing key).
        model (`str`): the model name the peer advertises.
        last_seen (`float`): wall-clock time of its newest index entry.
    """

    peer: str
    model: str
    last_seen: float


class SwarmCounters:
    """Thread-safe counters of what a transport did: groups published, fetched, rejected by reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``name`` (e.g. ``"published_groups"``, ``"rejected/too_large"``)."""
        with self._lock:
            self._counts[name] += amount

    def reject(self, reason: str, amount: int = 1) -> None:
        """Count ``amount`` rejected items under ``rejected/<reason>``."""
        self.add(f"rejected/{reason}", amount)

    def snapshot(self) -> dict[str, int]:
        """A copy of all counters."""
        with self._lock:
            return dict(self._counts)


class TimingLog:
    """Thread-safe durations of a transport's background operations (stores, index reads, record lookups).

    Each sample is ``(finished_at, seconds)`` with ``finished_at`` on the transport's monotonic clock, so a reader
    keeps the samples after a moment of its choosing (e.g. after a warm-up) without clearing them for others.
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK, keep: int = 1000):
        self._clock = clock
        self._keep = keep
        self._lock = threading.Lock()
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def record(self, name: str, seconds: float) -> None:
        """Add one duration of operation ``name``; the oldest beyond ``keep`` per name are dropped."""
        with self._lock:
            self._samples.setdefault(name, deque(maxlen=self._keep)).append((self._clock.monotonic(), seconds))

    def snapshot(self) -> dict[str, list[tuple[float, float]]]:
        """A copy of the recent samples per operation name, oldest first."""
        with self._lock:
            return {name: list(samples) for name, samples in self._samples.items()}


@dataclass(frozen=True)
class TransportReadout:
    """Everything a transport reports about itself at one moment: the one read-out of every transport.

    Parameters:
        peer_id (`str`): this peer's identity, as others see it.
        healthy (`bool`): False once closed or when the peer can no longer reach the swarm (e.g. its daemon died).
        counters (`dict[str, int]`): totals since start: `published_groups`, `fetched_groups`, `received_groups`,
            `rejected/<reason>`, ... (a transport counts what it does; it never raises network errors).
        gauges (`dict[str, float]`): sizes of what it holds now (cached groups, stored DHT items, remembered refs).
        timings (`dict[str, list[tuple[float, float]]]`): recent `(finished_at, seconds)` of background operations
            per name (`publish`, `index`, `fetch`; `delivery`: seconds from a record's publication to its groups
            entering this peer's cache), `finished_at` on the monotonic clock.
        addresses (`list[str]`): multiaddrs other peers join through (empty for an in-memory transport).
    """

    peer_id: str
    healthy: bool
    counters: dict[str, int]
    gauges: dict[str, float] = field(default_factory=dict)
    timings: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    addresses: list[str] = field(default_factory=list)


class SwarmTransport(ABC):
    """What the trainer needs from a swarm: publish groups, take fresh groups of others, see peers.

    Implementations never block the caller on the network: :meth:`publish` queues, and
    :meth:`fetch` returns what a background task has already received. Received groups have passed
    every validator; invalid input is dropped and counted in :meth:`readout`, never raised.
    """

    @property
    @abstractmethod
    def peer_id(self) -> str:
        """This peer's identity as other peers see it in :attr:`ReceivedGroup.sender`."""

    @abstractmethod
    def publish(self, groups: Sequence[Group]) -> None:
        """Queue ``groups`` for publication and return at once.

        Raises :class:`swarm.records.RecordRejected` if the groups break this peer's own limits,
        since that is a bug of the caller, not of the network.
        """

    @abstractmethod
    def fetch(self, max_groups: int) -> list[ReceivedGroup]:
        """Return up to ``max_groups`` groups of other peers that were not returned before, newest first; never
        blocks.

        Groups are within the transport's record lifetime; how old a group a node still trains on is the node's
        choice (``SAPOConfig.max_group_age``, applied by its sampler). A transport that fetches in the background
        (:class:`swarm.dht.DHTTransport`) learns the pace and size of these calls and fetches the freshest groups
        just before the next call is due: call it once per step with the number of groups the step wants.
        """

    @abstractmethod
    def peers(self) -> list[PeerInfo]:
        """Other peers listed in the swarm: those that announced themselves or published within the record ttl."""

    @abstractmethod
    def readout(self) -> TransportReadout:
        """What this transport did and holds: counters (rejections as ``rejected/<reason>``), gauges, timings."""

    def healthy(self) -> bool:
        """False once closed, or when this peer can no longer publish or fetch."""
        return self.readout().healthy

    def judge(self, sender: str, usable: bool) -> None:
        """Be told the node's verdict on one group of ``sender``: usable (trained on) or bad (refused by the node's
        checks). A transport that schedules its fetches by sender (:class:`swarm.dht.DHTTransport`) gives a sender a
        share of its own once its groups were judged good; this one ignores it."""
        return None

    def bench(self, sender: str, seconds: float) -> None:
        """Be told that the node benched ``sender`` for ``seconds`` (it sets the sender's groups aside unread): a
        transport that schedules its fetches by sender (:class:`swarm.dht.DHTTransport`) fetches none of its records
        meanwhile, so that they take no room of a refill; this one ignores it."""
        return None

    def refusals(self) -> list[tuple[str, str]]:
        """The records of other peers this transport refused or never got served since the last call, as
        ``(sender, reason)``, so that the node's sender standing counts them as it counts the groups it refused
        itself; a transport that never refuses a sender's record returns none."""
        return []

    def ready_groups(self) -> int | None:
        """How many groups of others :meth:`fetch` would return at once; ``None`` for a transport that looks them up
        when fetch is called (nothing is held in advance)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Leave the swarm and release every resource (processes, sockets, threads)."""

    def __enter__(self) -> SwarmTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for_peers(
    transport: SwarmTransport,
    count: int,
    timeout: float,
    poll_interval: float = 1.0,
    on_wait: Callable[[int, float], None] | None = None,
) -> list[PeerInfo]:
    """Block until ``transport`` lists at least ``count`` other peers, or ``timeout`` seconds pass.

    Returns the peers listed at the end, which may be fewer than ``count`` after a timeout (the caller
    decides whether that is an error). ``on_wait(seen, waited_seconds)`` is called after every poll that
    found too few, e.g. to log progress.
    """
    started = time.monotonic()
    while True:
        peers = transport.peers()
        waited = time.monotonic() - started
        if len(peers) >= count or waited >= timeout:
            return peers
        if on_wait is not None:
            on_wait(len(peers), waited)
        time.sleep(min(poll_interval, max(0.0, timeout - waited)))


def wait_for_groups(transport: SwarmTransport, count: int, timeout: float, poll_interval: float = 0.5) -> int:
    """Block until ``transport`` holds at least ``count`` groups of others ready to fetch, or ``timeout`` passes.

    For a node that joins a swarm and should train on its groups from its first swarm step: ``fetch`` never
    blocks, and the first lookups of a fresh peer take seconds. A transport that holds nothing in advance
    (:meth:`SwarmTransport.ready_groups` is ``None``, e.g. the in-memory board, which reads on demand) returns at
    once. Returns the groups held at the end, which may be fewer than ``count`` after a timeout.
    """
    started = time.monotonic()
    while True:
        held = transport.ready_groups()
        if held is None:
            return count
        if held >= count or time.monotonic() - started >= timeout:
            return int(held)
        time.sleep(poll_interval)
