"""What a reader knows of the other peers: their records (from index entries and announcements), when it last heard
from each, which went silent or do not answer, and which records to fetch next, freshest first across publishers.

A peer is heard from when an announcement of it arrives (:mod:`swarm.announcements`) or an index read lists an
entry it wrote. A peer heard from by announcements is *departed* once it missed ``departed_after_missed`` of them:
silent for that many times its announcement period (:func:`announcement_period`: a publisher says "still here"
whenever it was silent that long) plus the clock tolerance; a peer known from the index alone is forgotten when its
entry expires. A departed peer's records are not chosen and it is not listed;
it is back as soon as it is heard from again. A publisher whose served record could not be fetched *rests*: its
records are not chosen for a while (``_UNREACHABLE_SECONDS``), or until it is heard from after the failure.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from swarm.announcements import Announcement
from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.records import IndexEntry, RecordRef
from swarm.transport import PeerInfo, SwarmCounters

logger = logging.getLogger(__name__)

_MISSING_TRIES = 3  # polls a listed record may be missing (its store still travelling) before it is given up
_UNREACHABLE_SECONDS = 30.0  # a publisher whose served record could not be fetched is not asked again this long
_GAPS_KEPT = 3  # gaps between a peer's announcements that make its announcement period
_MIN_PERIOD = 10.0  # seconds: the shortest announcement period (announcements may come in bursts)


def announcement_period(times: list[float], announce_interval: float) -> float:
    """The period at which a peer announces, from the times of its last few announcements (oldest first): the
    longest of the last ``_GAPS_KEPT`` gaps between them, from ``_MIN_PERIOD`` to ``announce_interval``, and
    ``announce_interval`` while fewer than two gaps are known. A publisher says "still here" whenever it was silent for
    its period, and a reader takes it as departed when silent for ``departed_after_missed`` periods: both apply this
    rule to the same announcements."""
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)][-_GAPS_KEPT:]
    if len(gaps) < 2:
        return announce_interval
    return min(max(max(gaps), _MIN_PERIOD), announce_interval)


@dataclass
class SenderState:
    """One other peer as a reader knows it.

    Parameters:
        public_key (`bytes`): its OpenSSH public key (its records' owner marker).
        model (`str`): the model it advertises.
        last_seen (`float`): its clock's date of its newest index entry or announcement.
        heard_at (`float`): this peer's wall time of the newest word from it (an announcement's arrival, or the date
            of an index entry, whichever is later).
        refs (`dict[int, RecordRef]`): its records known, by sequence number (the newest few).
        host (`str` or `None`): the libp2p id serving its records; ``None``: they are in the DHT.
        announced_at (`collections.deque[float]`): this peer's wall times of its last announcements' arrivals.
        digests (`dict[int, bytes]`): announced digests of its records, by sequence number.
        departed (`bool`): it missed ``departed_after_missed`` announcements (see the module docstring).
    """

    public_key: bytes
    model: str
    last_seen: float
    heard_at: float
    refs: dict[int, RecordRef] = field(default_factory=dict)
    host: str | None = None
    announced_at: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=_GAPS_KEPT + 1))
    digests: dict[int, bytes] = field(default_factory=dict)
    departed: bool = False


@dataclass(frozen=True)
class Choice:
    """One record to fetch: its sender, its reference, the host serving it (``None``: in the DHT)."""

    sender: str
    ref: RecordRef
    host: str | None


class SenderBook:
    """The other peers a reader knows and their records (thread-safe).

    Args:
        config: intervals, ttl, how many refs a peer keeps listed, how many missed announcements mean departure.
        counters: where departures, returns and given-up records are counted.
        clock: wall time for every date here; monotonic time for rests.
        rng: breaks ties between records of the same date (publishers that published at the same moment).
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        counters: SwarmCounters,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ):
        self.config = config
        self._counters = counters
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._senders: dict[str, SenderState] = {}
        self._seen_refs: dict[tuple[str, int], float] = {}  # (sender, seq) -> created_at, pruned after the ttl
        self._missing_tries: collections.Counter[tuple[str, int]] = collections.Counter()
        self._in_flight: set[tuple[str, int]] = set()  # records being fetched now: not chosen again meanwhile
        # host -> (monotonic time it may be asked again, wall time of the failure)
        self._unreachable: dict[str, tuple[float, float]] = {}

    # ------------------------------------------------------------------------------ what arrives

    def take_index_entry(self, sender: str, public_key: bytes, entry: IndexEntry) -> bool:
        """Take a (checked) index entry of ``sender``; True if it was not known before."""
        with self._lock:
            state = self._senders.get(sender)
            new = state is None
            if state is None:
                state = self._senders[sender] = SenderState(public_key, entry.model, entry.updated_at, entry.updated_at)
            if entry.updated_at >= state.last_seen:  # an older copy (another level's, a stale replica) is not news
                state.model, state.last_seen = entry.model, entry.updated_at
                state.host = entry.host
            # but its refs are: an announcement lists the newest two records only, and an entry written before it
            # may list older ones that no announcement carried (a record's ref never changes)
            for ref in entry.records:
                state.refs.setdefault(ref.seq, ref)
            self._trim(state)
            self._heard(sender, state, entry.updated_at, entry.host)
        return new

    def take_announcement(self, announcement: Announcement) -> bool:
        """Take a (checked) announcement; True if its sender was not known before."""
        now = self._clock.time()
        sender = announcement.sender
        with self._lock:
            state = self._senders.get(sender)
            new = state is None
            if state is None:
                state = self._senders[sender] = SenderState(
                    announcement.public_key, announcement.model, announcement.updated_at, now
                )
            if announcement.updated_at >= state.last_seen:
                state.model, state.last_seen, state.host = (
                    announcement.model,
                    announcement.updated_at,
                    announcement.host,
                )
            for record in announcement.records:
                state.refs[record.seq] = RecordRef(record.seq, record.created_at, record.num_groups)
                state.digests[record.seq] = record.digest
            self._trim(state)
            state.announced_at.append(now)
            self._heard(sender, state, now, announcement.host)
        return new

    def _trim(self, state: SenderState) -> None:
        """Keep the newest ``2 * index_records`` refs of a peer (the rest could never be the freshest choice)."""
        keep = 2 * self.config.index_records
        if len(state.refs) > keep:
            for seq in sorted(state.refs)[:-keep]:
                del state.refs[seq]
                state.digests.pop(seq, None)

    def _heard(self, sender: str, state: SenderState, at: float, host: str | None) -> None:
        """Word from ``sender`` dated ``at``: it is not departed, and a rest of its host from before ends."""
        state.heard_at = max(state.heard_at, at)
        if state.departed and not self._silent(state, self._clock.time()):
            state.departed = False
            self._counters.add("returned_senders")
            logger.info("key fingerprint %s is back", sender)
        rest = self._unreachable.get(host) if host is not None else None
        if rest is not None and at > rest[1]:  # heard from after our request failed: it is back
            del self._unreachable[host]

    # ------------------------------------------------------------------------------ departures

    def usual_gap(self, state: SenderState) -> float:
        """The gap at which ``state``'s peer is expected to announce: its :func:`announcement_period` from the
        arrivals of its announcements (``announce_interval`` before any)."""
        return announcement_period(list(state.announced_at), self.config.announce_interval)

    def _silent(self, state: SenderState, now: float, since: float = -float("inf")) -> bool:
        allowed = self.config.departed_after_missed * self.usual_gap(state) + self.config.clock_skew_tolerance
        return now - max(state.heard_at, since) > allowed

    def mark_departures(self, audible: Callable[[str], bool] = lambda sender: True, since: float = 0.0) -> list[str]:
        """Mark the peers that missed ``departed_after_missed`` announcements as departed; returns those marked
        now (each is counted once as ``departed_senders``). Only peers whose announcements this peer should hear
        (``audible``: on the topics it listens to now, which it has done since wall time ``since``) can miss one;
        a peer known from the index alone is forgotten when its entry expires."""
        now = self._clock.time()
        marked = []
        with self._lock:
            for sender, state in self._senders.items():
                if not state.announced_at or state.departed or not audible(sender):
                    continue
                if self._silent(state, now, since):
                    state.departed = True
                    marked.append(sender)
        for sender in marked:
            self._counters.add("departed_senders")
            logger.info(
                "key fingerprint %s missed %d announcements: dropped", sender, self.config.departed_after_missed
            )
        return marked

    # ------------------------------------------------------------------------------ choosing and fetching

    def choose(self, need: int, spares: int = 0) -> tuple[list[Choice], list[Choice]]:
        """Unseen fresh records to fetch for ``need`` groups, freshest first across publishers: every publisher's
        newest unseen record in order of its date, then every publisher's next one, and so on; and up to ``spares``
        more records of other publishers (to hedge a slow fetch with). Records of resting hosts are left out, and
        so are a departed publisher's records that left with it: those it served itself, unless another publisher
        heard from (not departed) serves from the same host. Its records stored in the DHT live on until their ttl
        and stay choosable: a publisher that announced its records and left before this reader's next refill
        (which comes once per step of its caller) would otherwise never have them read."""
        now = self._clock.time()
        oldest, newest = now - self.config.record_ttl, now + self.config.clock_skew_tolerance
        resting = self.resting_hosts()
        with self._lock:
            live_hosts = {state.host for state in self._senders.values() if not state.departed}
            per_peer = {
                sender: sorted(
                    (
                        ref
                        for seq, ref in state.refs.items()
                        if (sender, seq) not in self._seen_refs
                        and (sender, seq) not in self._in_flight
                        and oldest <= ref.created_at <= newest
                    ),
                    key=lambda ref: -ref.created_at,
                )
                for sender, state in self._senders.items()
                if (state.host is None or state.host not in resting)
                and (not state.departed or state.host is None or state.host in live_hosts)
            }
            hosts = {sender: state.host for sender, state in self._senders.items()}
        order = list(per_peer)
        self._rng.shuffle(order)  # ties of date go to a random publisher, not always the same one
        per_peer = {sender: per_peer[sender] for sender in order}
        rounds: list[list[Choice]] = []
        while any(per_peer.values()):
            heads = [Choice(sender, refs.pop(0), hosts[sender]) for sender, refs in per_peer.items() if refs]
            rounds.append(sorted(heads, key=lambda choice: -choice.ref.created_at))
        chosen: list[Choice] = []
        expected = 0
        ordered = [choice for round_ in rounds for choice in round_]
        while ordered and expected < need:
            choice = ordered.pop(0)
            chosen.append(choice)
            expected += max(1, choice.ref.num_groups)
        taken_from = {choice.sender for choice in chosen}
        spare: list[Choice] = []
        for choice in ordered:  # one per publisher, none of the chosen ones': a hedge goes to another publisher
            if len(spare) < spares and choice.sender not in taken_from:
                spare.append(choice)
                taken_from.add(choice.sender)
        return chosen, spare

    def has_candidates(self) -> bool:
        """True if some unseen fresh record that :meth:`choose` would fetch is known."""
        return bool(self.choose(1)[0])

    def digest(self, sender: str, seq: int) -> bytes | None:
        """The digest ``sender`` announced for record ``seq``; ``None`` if it was not announced."""
        with self._lock:
            state = self._senders.get(sender)
            return None if state is None else state.digests.get(seq)

    def public_key(self, sender: str) -> bytes | None:
        """``sender``'s public key, if known."""
        with self._lock:
            state = self._senders.get(sender)
            return None if state is None else state.public_key

    def fetching(self, choice: Choice, now: bool) -> None:
        """``choice`` is being fetched (``now`` True) or no longer is: meanwhile it is not chosen again."""
        with self._lock:
            if now:
                self._in_flight.add((choice.sender, choice.ref.seq))
            else:
                self._in_flight.discard((choice.sender, choice.ref.seq))

    def mark_fetched(self, sender: str, ref: RecordRef) -> None:
        """``ref`` arrived (or is not to be asked for again): it is not chosen again."""
        with self._lock:
            self._seen_refs[(sender, ref.seq)] = ref.created_at
            self._missing_tries.pop((sender, ref.seq), None)

    def record_missing(self, sender: str, ref: RecordRef) -> None:
        """Not there yet (a store still travelling) or lost: retried a few polls, then given up (counted as
        ``records_missing``)."""
        with self._lock:
            self._missing_tries[(sender, ref.seq)] += 1
            if self._missing_tries[(sender, ref.seq)] < _MISSING_TRIES:
                return
            del self._missing_tries[(sender, ref.seq)]
            self._seen_refs[(sender, ref.seq)] = ref.created_at
        self._counters.add("records_missing")

    def rest(self, host: str) -> None:
        """``host`` did not answer: its records are not chosen for ``_UNREACHABLE_SECONDS`` or until it is heard
        from again."""
        with self._lock:
            self._unreachable[host] = (self._clock.monotonic() + _UNREACHABLE_SECONDS, self._clock.time())

    def resting_hosts(self) -> set[str]:
        """Hosts whose last request failed within ``_UNREACHABLE_SECONDS`` and that were not heard from since."""
        now = self._clock.monotonic()
        with self._lock:
            for host in [host for host, (until, _) in self._unreachable.items() if until <= now]:
                del self._unreachable[host]
            return set(self._unreachable)

    # ------------------------------------------------------------------------------ listing and forgetting

    def peers(self) -> list[PeerInfo]:
        """The peers heard from within the record ttl that did not depart."""
        horizon = self._clock.time() - self.config.record_ttl
        with self._lock:
            return [
                PeerInfo(peer=sender, model=state.model, last_seen=state.last_seen)
                for sender, state in self._senders.items()
                if state.last_seen >= horizon and not state.departed
            ]

    def senders(self) -> list[str]:
        """Every peer known (departed ones included)."""
        with self._lock:
            return list(self._senders)

    def hosts(self) -> dict[str, str]:
        """The libp2p host of every known peer that serves its records and did not depart, by sender."""
        with self._lock:
            return {s: state.host for s, state in self._senders.items() if state.host and not state.departed}

    def forget_expired(self) -> None:
        """Drop bookkeeping older than the record ttl, so that a long-running peer's memory stays bounded."""
        horizon = self._clock.time() - self.config.record_ttl - self.config.clock_skew_tolerance
        with self._lock:
            for ref in [ref for ref, created_at in self._seen_refs.items() if created_at < horizon]:
                del self._seen_refs[ref]
            for sender in [s for s, state in self._senders.items() if max(state.last_seen, state.heard_at) < horizon]:
                del self._senders[sender]

    def gauges(self) -> dict[str, float]:
        """Peers known and departed, refs remembered as fetched."""
        with self._lock:
            return {
                "known_senders": float(len(self._senders)),
                "departed_senders": float(sum(state.departed for state in self._senders.values())),
                "seen_refs": float(len(self._seen_refs)),
            }
