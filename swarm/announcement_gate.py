"""Bounds what one publisher's announcements make this node check: a publisher over its budget, or whose
announcements are mostly refused, rests, and publishers never heard before share one budget.

Every announcement of a topic this node listens to is decoded and its RSA signature verified on the transport's event
loop (35-100 µs of CPU), and a signature costs nothing to forge: one libp2p peer publishing announcements whose
signature is random bytes had about 44,000 delivered in 10 s, each checked and refused. An honest publisher announces
once per record it publishes (about one a training step) and every ``announce_interval`` on each topic it publishes on,
so a few a second at most. :class:`AnnouncementGate` sits in front of :meth:`swarm.reader.SwarmReader.take_announcement`
and counts, per publisher (the libp2p peer the daemon verified as the message's originator; a forger cannot choose it),
the announcements it delivered in a window of :data:`WINDOW_SECONDS`:

- over :data:`PUBLISHER_BUDGET` in a window, the publisher rests: its announcements are dropped unread
  (``rejected/announce_budget``, then ``rejected/announce_rested``) for :data:`REST_SECONDS`, doubling on each rest up
  to :data:`~swarm.rest_book.MAX_REST_SECONDS`;
- :data:`MIN_REFUSED` refusals in a window (a bad signature, a closed swarm's outsider, another peer's announcement,
  a date out of bounds), at least half of what it delivered, rest it as well; a copy of an announcement already taken
  is not a refusal (a publisher's one announcement may reach this node on two topics);
- publishers with no announcement taken yet (*strangers*: a libp2p identity costs a key) share
  :data:`STRANGERS_BUDGET` a window: beyond it their announcements are dropped unread until the window ends
  (``rejected/announce_strangers``), and nobody rests for it, except those of a libp2p host the reader already knows
  from an index entry (``known_hosts``). A newcomer announcing during a strangers' flood is therefore heard through
  the index first (its entry is rewritten every ``announce_interval``), and by announcement once the index named its
  host.

The books are bounded (:data:`MAX_PUBLISHERS` publishers counted, as many remembered as heard), so fresh identities
cannot grow them. This node's own announcements are not counted.
"""

from __future__ import annotations

import collections
import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from swarm.rest_book import HostWindow, RestBook, SenderWindow
from swarm.transport import SwarmCounters

__all__ = [
    "KNOWN_HOSTS_SECONDS",
    "MIN_REFUSED",
    "PUBLISHER_BUDGET",
    "REST_SECONDS",
    "STRANGERS_BUDGET",
    "WINDOW_SECONDS",
    "AnnouncementGate",
    "Taken",
]

WINDOW_SECONDS = 10.0
"""Seconds over which a publisher's announcements are counted together."""

PUBLISHER_BUDGET = 64
"""Announcements one publisher may deliver in a window (an honest one delivers a few: one a record, on two topics)."""

MIN_REFUSED = 8
"""Refused announcements in a window that rest their publisher (when they are at least half of what it delivered)."""

REST_SECONDS = 30.0
"""A publisher's first rest; each further rest doubles it."""

STRANGERS_BUDGET = 256
"""Announcements that the publishers with none taken yet may deliver together in a window."""

MAX_PUBLISHERS = 4096
"""Publishers counted (the oldest not resting forgotten first), and publishers remembered as heard."""

KNOWN_HOSTS_SECONDS = 1.0
"""How long the hosts the reader knows are kept before they are asked again (read only during a strangers' flood)."""


class Taken(enum.Enum):
    """What became of one announcement handed to the reader; truthy only when it was taken."""

    TAKEN = "taken"
    REPEATED = "repeated"  # a copy of one seen before: nothing new, nothing wrong
    OWN = "own"  # this node's own
    REFUSED = "refused"

    def __bool__(self) -> bool:
        return self is Taken.TAKEN


@dataclass
class _PublisherWindow(SenderWindow):
    delivered: int = 0
    refused: int = 0

    def clear(self) -> None:
        """Count this publisher's announcements afresh."""
        self.delivered, self.refused = 0, 0


class AnnouncementGate:
    """Per-publisher accounting of announcements, the rest of a publisher over its budget or mostly refused, and the
    strangers' shared budget (see the module docstring).

    Parameters:
        counters: where ``rejected/announce_budget``, ``rejected/announce_rested``, ``rejected/announce_strangers``
            and ``announce_publishers_rested`` go.
        own_peer: returns this node's libp2p id (base58; it is known once the peer runs): its announcements are not
            counted.
        clock: monotonic seconds (tests pass their own).
        known_hosts: the libp2p hosts the reader knows its senders serve from (index entries included), asked at
            most once per :data:`KNOWN_HOSTS_SECONDS` while the strangers' budget is spent; None: none known.
    """

    def __init__(
        self,
        counters: SwarmCounters,
        own_peer: Callable[[], str],
        clock: Callable[[], float] = time.monotonic,
        known_hosts: Callable[[], Iterable[str]] | None = None,
    ):
        self.counters = counters
        self.own_peer = own_peer
        self.clock = clock
        self.known_hosts = known_hosts
        self._known: frozenset[str] = frozenset()
        self._known_at = -float("inf")
        self._book = RestBook(
            _PublisherWindow, WINDOW_SECONDS, REST_SECONDS, MAX_PUBLISHERS,
            lambda: counters.add("announce_publishers_rested"), clock,
        )  # fmt: skip
        self._heard: collections.OrderedDict[str, None] = collections.OrderedDict()  # publishers with one taken
        self._strangers = HostWindow(began=clock())

    def resting(self, publisher: str) -> bool:
        """Whether ``publisher``'s announcements are dropped unread now."""
        return self._book.resting(publisher)

    def guard(self, take: Callable[[bytes, str], Taken]) -> Callable[[bytes, str], Taken]:
        """``take(data, publisher)`` (:meth:`swarm.reader.SwarmReader.take_announcement`) behind the gate: an
        announcement :meth:`admit` refuses is dropped unread (:data:`Taken.REFUSED`); any other is taken, and its
        outcome counted (:meth:`settle`)."""

        def gated(data: bytes, publisher: str) -> Taken:
            if publisher == self.own_peer():
                return take(data, publisher)
            if not self.admit(publisher):
                return Taken.REFUSED
            outcome = take(data, publisher)
            self.settle(publisher, outcome)
            return outcome

        return gated

    def admit(self, publisher: str) -> bool:
        """Count one announcement of ``publisher`` as it arrives; False (counted under its reason) if it is to be
        dropped unread: its publisher rests, goes over its budget now (and rests), or is a stranger over the
        strangers' budget that no index entry named as a host (``known_hosts``)."""
        if self._book.resting(publisher):
            self.counters.reject("announce_rested")
            return False
        entry = self._book.entry(publisher)
        entry.delivered += 1
        if entry.delivered > PUBLISHER_BUDGET:
            self._book.start_rest(entry)
            self.counters.reject("announce_budget")
            return False
        if publisher not in self._heard:
            now = self.clock()
            if now - self._strangers.began > WINDOW_SECONDS:
                self._strangers = HostWindow(began=now)
            self._strangers.count += 1
            if self._strangers.count > STRANGERS_BUDGET and not self._known_host(publisher):
                self.counters.reject("announce_strangers")
                return False
        return True

    def _known_host(self, publisher: str) -> bool:
        """Whether ``publisher`` is a host the reader knows (``known_hosts``, asked again once the last answer is
        :data:`KNOWN_HOSTS_SECONDS` old)."""
        if self.known_hosts is None:
            return False
        now = self.clock()
        if now - self._known_at > KNOWN_HOSTS_SECONDS:
            self._known, self._known_at = frozenset(self.known_hosts()), now
        return publisher in self._known

    def settle(self, publisher: str, outcome: Taken) -> None:
        """Count what became of an admitted announcement: a refusal into its publisher's window (resting it at
        :data:`MIN_REFUSED`, when they are half of what it delivered), a taken one makes it heard."""
        if outcome is Taken.TAKEN:
            self._heard[publisher] = None
            self._heard.move_to_end(publisher)
            if len(self._heard) > MAX_PUBLISHERS:
                self._heard.popitem(last=False)
        elif outcome is Taken.REFUSED:
            entry = self._book.entry(publisher)
            entry.refused += 1
            if entry.refused >= MIN_REFUSED and 2 * entry.refused >= entry.delivered:
                self._book.start_rest(entry)
