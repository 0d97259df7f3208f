"""What a reader holds of one other peer (:class:`SenderState`), a record it chose to fetch (:class:`Choice`), and
the announcement period that a publisher and a reader both apply (:func:`announcement_period`); the book of them all
is :class:`swarm.senders.SenderBook`."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from swarm.records import RecordRef

STANDING_WINDOW = 10
"""A sender's latest outcomes (node verdicts and strikes) that make its standing."""

SERVED_WINDOW = 8
"""A sender's latest records that this reader asked for and got an answer about (served, or answered without)."""
SERVED_MIN = 4
"""Records asked for and answered about before a sender may be found to serve little (`SenderState.serves_little`)."""

PERIOD_GAPS = 3
"""Gaps between a peer's announcements that make its announcement period."""

MIN_PERIOD = 10.0
"""Seconds: the shortest announcement period (announcements may come in bursts)."""


def announcement_period(times: list[float], announce_interval: float) -> float:
    """The period at which a peer announces, from the times of its last few announcements (oldest first): the
    longest of the last ``PERIOD_GAPS`` gaps between them, from ``MIN_PERIOD`` to ``announce_interval``, and
    ``announce_interval`` while fewer than two gaps are known. A publisher says "still here" whenever it was silent for
    its period, and a reader takes it as departed when silent for ``departed_after_missed`` periods: both apply this
    rule to the same announcements."""
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)][-PERIOD_GAPS:]
    if len(gaps) < 2:
        return announce_interval
    return min(max(max(gaps), MIN_PERIOD), announce_interval)


@dataclass
class SenderState:
    """One other peer as a reader knows it.

    Parameters:
        public_key (`bytes`): its OpenSSH public key (its records' owner marker).
        model (`str`): the model it advertises.
        last_seen (`float`): its clock's date of its newest index entry or announcement.
        heard_at (`float`): this peer's wall time of the newest word from it (an announcement's arrival, or the date
            of an index entry, at most this peer's now, whichever is later): the book forgets the unjudged sender
            heard from longest ago first.
        refs (`dict[int, RecordRef]`): its records known, by sequence number (the newest few).
        host (`str` or `None`): the libp2p id serving its records; ``None``: they are in the DHT.
        announced_at (`collections.deque[float]`): this peer's wall times of its last announcements' arrivals.
        digests (`dict[int, bytes]`): announced digests of its records, by sequence number.
        sizes (`dict[int, int]`): announced sizes of its records in bytes, by sequence number.
        group_bytes (`int`): the most bytes a group of its records fetched took (a record's bytes over its groups):
            the size of a record it did not announce is estimated from it.
        departed (`bool`): it missed ``departed_after_missed`` announcements (see the module docstring).
        heard (`dict[int, float]`): this peer's wall time at which each of its records was first heard of.
        outcomes (`collections.deque[bool]`): its latest outcomes: True a group judged usable, False a group judged
            bad or a strike.
        served (`collections.deque[bool]`): its latest records asked for and answered about: True one that arrived,
            False one given up after its host (or the DHT) answered without it.
        rest_until (`float`): monotonic time before which its records are not chosen (after a strike, or while the
            node benched it: :meth:`swarm.senders.SenderBook.bench`).
        origin (`str` or `None`): the libp2p host whose announcement made it known (or first announced it after
            index entries did): the host that vouches for it. ``None``: known from index entries alone.
        turn (`float`): its place in the queue for a refill's turns: the number of fetches begun by this reader when
            its last fetch began, or, never fetched from, those begun when it entered the book plus a half
            (:mod:`swarm.refill`: the lowest goes first, so the sender that waited longest; senders first heard
            between the same two fetches are equals, the freshest record first).
    """

    public_key: bytes
    model: str
    last_seen: float
    heard_at: float
    refs: dict[int, RecordRef] = field(default_factory=dict)
    host: str | None = None
    announced_at: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=PERIOD_GAPS + 1))
    digests: dict[int, bytes] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    group_bytes: int = 0
    departed: bool = False
    heard: dict[int, float] = field(default_factory=dict)
    outcomes: collections.deque[bool] = field(default_factory=lambda: collections.deque(maxlen=STANDING_WINDOW))
    served: collections.deque[bool] = field(default_factory=lambda: collections.deque(maxlen=SERVED_WINDOW))
    rest_until: float = 0.0
    origin: str | None = None
    turn: float = 0.0

    def drop_record(self, seq: int) -> None:
        """Forget record ``seq``: its reference and what was announced and heard of it."""
        self.refs.pop(seq, None)
        self.digests.pop(seq, None)
        self.sizes.pop(seq, None)
        self.heard.pop(seq, None)

    def announced(self, seq: int) -> tuple[bytes, int] | None:
        """The digest and size it announced for record ``seq``; ``None`` if it did not announce it."""
        if seq not in self.digests:
            return None
        return self.digests[seq], self.sizes[seq]

    def record_size(self, seq: int, unknown: int) -> int:
        """Record ``seq``'s bytes as announced, else as its records fetched suggest, else ``unknown``."""
        announced = self.sizes.get(seq)
        if announced is not None:
            return announced
        ref = self.refs.get(seq)
        if ref is None or not self.group_bytes:
            return unknown
        return ref.num_groups * self.group_bytes

    def judged_good(self) -> bool:
        """Most of its latest outcomes are usable groups (it has a share of a refill of its own)."""
        good = self.outcomes.count(True)
        return good > 0 and good > len(self.outcomes) - good

    def serves_little(self) -> bool:
        """Of its latest records asked for and answered about, it served none of :data:`SERVED_MIN` or more, or at
        most one of :data:`SERVED_WINDOW`: it announces records it does not serve. An honest publisher too fast for
        this reader (its older records pushed out before the reader asks) still serves most of the fresh ones asked."""
        asked = len(self.served)
        return asked >= SERVED_MIN and self.served.count(True) <= asked // SERVED_WINDOW

    def stands_badly(self) -> bool:
        """Most of its latest outcomes are bad groups or strikes."""
        bad = self.outcomes.count(False)
        return bad > len(self.outcomes) - bad


@dataclass(frozen=True)
class Choice:
    """One record to fetch: its sender, its reference, the host serving it (``None``: in the DHT), and the digest and
    size its sender announced for it (``None``: not announced), kept with it in case the book forgets them while it
    is fetched."""

    sender: str
    ref: RecordRef
    host: str | None
    announced: tuple[bytes, int] | None = None
