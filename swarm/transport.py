"""The interface every swarm transport implements, and the counters it keeps."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


class SwarmTransport(ABC):
    """What the trainer needs from a swarm: publish groups, take fresh groups of others, see peers.

    Implementations never block the caller on the network: :meth:`publish` queues, and
    :meth:`fetch` returns what a background task has already received. Received groups have passed
    every validator; invalid input is dropped and counted in :meth:`counters`, never raised.
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
    def fetch(self, max_groups: int, max_age: float | None = None) -> list[ReceivedGroup]:
        """Return up to ``max_groups`` fresh groups of other peers that were not returned before.

        Never blocks on the network. ``max_age`` (seconds) drops groups created longer ago.
        """

    @abstractmethod
    def peers(self) -> list[PeerInfo]:
        """Other peers listed in the swarm: those that announced themselves or published within the record ttl."""

    @abstractmethod
    def counters(self) -> dict[str, int]:
        """Counters of published, fetched and rejected items (rejections as ``rejected/<reason>``)."""

    def gauges(self) -> dict[str, float]:
        """Sizes of what this transport holds now (stored items, caches), for logs; empty if it keeps none."""
        return {}

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
