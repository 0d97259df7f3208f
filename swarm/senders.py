"""What a reader knows of the other peers: their records (from index entries and announcements), when it last heard
from each, which went silent or do not answer, how each stands, and which records to fetch next.

A peer is heard from when an announcement of it arrives (:mod:`swarm.announcements`) or an index read lists an
entry it wrote. A peer heard from by announcements is *departed* once it missed ``departed_after_missed`` of them:
silent for that many times its announcement period (:func:`announcement_period`: a publisher says "still here"
whenever it was silent that long) plus the clock tolerance; a peer known from the index alone is forgotten when its
entry expires. A departed peer's records are not chosen and it is not listed; the records it served are counted as
heard and never fetched. It is back as soon as it is heard from again.

Standing. Identities are free (a key each), so what a sender says earns it nothing until it is checked:

- a sender is *judged good* once the node's verdicts on its groups (:meth:`SenderBook.judge`) are mostly usable; only
  then does it have a share of a refill of its own (:mod:`swarm.refill`), the others sharing a small pool;
- a record refused (malformed, not the one announced, a broken claim), or announced and then never served (the
  host answered without it, or a DHT lookup never found it, at its last try; or at any try, once the sender served
  little of what it was asked: :meth:`SenderState.serves_little`), is a *strike*: it counts against its sender as a
  refused group does, rests the sender (1 s, doubling with each strike among its last
  :data:`swarm.sender_state.STANDING_WINDOW` outcomes, at most :data:`swarm.host_rests.LONGEST_REST_SECONDS`), and is
  handed to the node (:meth:`SenderBook.refusals`) so that its own sender standing sees it too;
- a host whose request failed rests, and is asked at most :data:`swarm.host_rests.HOST_REQUESTS` times a window
  (:mod:`swarm.host_rests`); heard from after the failure, it is asked again at once, unless its sender stands badly;
- the senders not judged good are at most ``max_unknown_senders`` (the least useful is forgotten first: one that
  stands badly, then one never judged, the one heard from longest ago first), and at most
  ``max_senders_per_host`` of them may be announced by one libp2p host;
- of that book, ``index_only_sender_share`` is the part of the senders known from index entries alone (no libp2p
  host announced them: anyone may write an index entry under a fresh key), the rest the part of announced senders;
  either kind may use the other's free places, and when the book is over its bound the kind over its part loses its
  least useful sender. Identities that list themselves through index entries alone thus never forget an announced
  newcomer while the announced are within their part (nor announced identities an index-only peer within its).

A record heard and never fetched (given up, trimmed, expired, gone with its publisher, or its sender forgotten) is
counted as ``heard_never_fetched``.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from collections.abc import Callable, Iterable

from swarm.announcements import Announcement
from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.host_rests import LONGEST_REST_SECONDS, HostRests
from swarm.log_lines import PeerLines
from swarm.records import IndexEntry, RecordRef
from swarm.refill import Offer, Spent, caps, covered, plan_refill, room, weight
from swarm.sender_state import Choice, SenderState, announcement_period
from swarm.transport import PeerInfo, SwarmCounters

logger = logging.getLogger(__name__)

_MISSING_TRIES = 3  # polls a listed record may be missing (its store still travelling) before it is given up
_REFUSALS_KEPT = 10_000  # strikes waiting for the node to take them (a flood loses the oldest, not memory)
_BENCHES_KEPT = 10_000  # senders benched by the node, remembered while benched even if the book forgot them
_SEEN_REFS_KEPT = 20_000  # refs not to fetch again (a sybil flood of departures loses the oldest, not memory)
_MISSING_KEPT = 10_000  # listed refs between missing tries (beyond it, the one tried longest ago is given up)


class SenderBook:
    """The other peers a reader knows, their records and their standing (thread-safe).

    Args:
        config: intervals, ttl, how many refs a peer keeps listed, how many missed announcements mean departure, the
            refill's shares, the bounds of the book and the retry wait.
        counters: where departures, returns, given-up records, strikes and records never fetched are counted.
        clock: wall time for every date here; monotonic time for rests.
        rng: breaks ties between records of the same date (publishers that published at the same moment).
        fresh_within: seconds within which a record counts as fresh (the reader's :func:`swarm.refill.fresh_window`
            of its caller's step); ``None``: every record does. Fresh records go first in a refill
            (:mod:`swarm.refill`).
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        counters: SwarmCounters,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        fresh_within: Callable[[], float | None] = lambda: None,
    ):
        self.config = config
        self._counters = counters
        self._clock = clock
        self._peer_lines = PeerLines(logger, clock.monotonic)  # senders back or dropped: 10 lines a minute at most
        self._fresh_within = fresh_within
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._senders: dict[str, SenderState] = {}
        # (sender, seq) -> its date at most this peer's now when remembered (a date ahead is the sender's word: one
        # dated 1e12 was never pruned), forgotten after the ttl or, over _SEEN_REFS_KEPT, oldest first
        self._seen_refs: dict[tuple[str, int], float] = {}
        # (sender, seq) -> (its missing tries, whether an answer came without it), for refs still listed only: a ref
        # that leaves the book takes its entry with it (refs trimmed by newer ones had left them for good)
        self._missing_tries: dict[tuple[str, int], tuple[int, bool]] = {}
        self._in_flight: set[tuple[str, int]] = set()  # records being fetched now: not chosen again meanwhile
        self._hosts = HostRests()  # hosts resting after a failure or at their request budget
        self._by_origin: dict[str, set[str]] = {}  # libp2p host -> the senders its announcements made known
        self._refusals: collections.deque[tuple[str, str]] = collections.deque(maxlen=_REFUSALS_KEPT)
        self._benched: dict[str, float] = {}  # sender -> monotonic time its bench by the node ends
        self._fetches_begun = 0  # places in the queue for a refill's turns (SenderState.turn)
        # what each sender's records fetched since the reader's last take count for (swarm.refill.Spent): counted
        # when a fetch begins (a fetch under way counts), set to the record's true weight when it arrives, given back
        # if its host answered without it (an answer that timed out may have carried bytes: never given back)
        self._spent: collections.Counter[str] = collections.Counter()
        self._begun: dict[tuple[str, int], int] = {}  # fetches under way: what each counts for in this take
        self._came_without: set[tuple[str, int]] = set()  # ...and those whose host answered without the record

    # ------------------------------------------------------------------------------ what arrives

    def take_index_entry(self, sender: str, public_key: bytes, entry: IndexEntry) -> bool:
        """Take a (checked) index entry of ``sender``; True if it was not known before."""
        now = self._clock.time()
        heard = min(entry.updated_at, now)  # the entry's date is its sender's word: one ahead of ours buys nothing
        with self._lock:
            state = self._senders.get(sender)
            new = state is None
            if state is None:
                state = SenderState(public_key, entry.model, entry.updated_at, heard)
                if not self._admit(sender, state):
                    return False  # forgotten at once: its part of the book holds fresher senders
            if entry.updated_at >= state.last_seen:  # an older copy (another level's, a stale replica) is not news
                state.model, state.last_seen = entry.model, entry.updated_at
                state.host = entry.host
            # but its refs are: an announcement lists the newest two records only, and an entry written before it
            # may list older ones that no announcement carried (a record's ref never changes)
            for ref in entry.records:
                state.refs.setdefault(ref.seq, ref)
                state.heard.setdefault(ref.seq, now)
            self._trim(sender, state)
            self._heard(sender, state, heard, entry.host)
        return new

    def take_announcement(self, announcement: Announcement, origin: str | None = None) -> bool | None:
        """Take a (checked) announcement that libp2p host ``origin`` published; True if its sender was not known
        before, None if it was refused: a new sender while ``origin`` already made ``max_senders_per_host`` known
        (counted as ``rejected/too_many_identities``), or one forgotten at once because its part of the book holds
        fresher senders (counted as ``evicted_senders``). A sender known from index entries alone is vouched for by
        ``origin`` from then on, within the same cap."""
        now = self._clock.time()
        sender = announcement.sender
        origin = origin or None  # a message without a publisher (the daemon signs each one) vouches for nobody
        with self._lock:
            state = self._senders.get(sender)
            new = state is None
            cap = self.config.max_senders_per_host
            vouches = origin is not None and not (cap and len(self._by_origin.get(origin, ())) >= cap)
            if state is None:
                if origin is not None and not vouches:
                    self._counters.reject("too_many_identities")
                    return None
                state = SenderState(announcement.public_key, announcement.model, announcement.updated_at, now)
                state.origin = origin
                if not self._admit(sender, state):
                    return None
            elif state.origin is None and vouches:  # first heard through the index: announced now
                state.origin = origin
                self._by_origin.setdefault(origin, set()).add(sender)
            if announcement.updated_at >= state.last_seen:
                state.model, state.last_seen, state.host = (
                    announcement.model,
                    announcement.updated_at,
                    announcement.host,
                )
            for record in announcement.records:
                state.refs[record.seq] = RecordRef(record.seq, record.created_at, record.num_groups)
                state.digests[record.seq] = record.digest
                state.sizes[record.seq] = record.size
                state.heard.setdefault(record.seq, now)
            self._trim(sender, state)
            state.announced_at.append(now)
            self._heard(sender, state, now, announcement.host)
        return new

    def _admit(self, sender: str, state: SenderState) -> bool:
        """Add a sender never seen before; if the senders not judged good are then more than
        ``max_unknown_senders``, forget the least useful of them (counted as ``evicted_senders``) of the kind over
        its part of the book (see the module docstring). True if ``sender`` stayed in the book."""
        self._senders[sender] = state
        state.rest_until = self._benched.get(sender, 0.0)  # forgotten and heard again: still benched
        # it queues for its turn behind the fetches begun so far: identities made after a newcomer's fetch wait
        # behind it, however fresh their records
        state.turn = self._fetches_begun + 0.5
        if state.origin is not None:
            self._by_origin.setdefault(state.origin, set()).add(sender)
        config = self.config
        unknown = [(name, other) for name, other in self._senders.items() if not other.judged_good()]
        if len(unknown) <= config.max_unknown_senders:
            return True
        # Index entries are written under fresh keys with no libp2p host vouching for them: that kind is evicted
        # among itself once over its part, so that its number cannot forget an announced newcomer (and the other way
        # round). Over the bound, at least one kind is over its part: the index-only kind first.
        index_only = [item for item in unknown if item[1].origin is None]
        if len(index_only) > int(config.index_only_sender_share * config.max_unknown_senders):
            pool = index_only
        else:
            pool = [item for item in unknown if item[1].origin is not None]
        # least useful first: standing badly, then never judged, then heard from longest ago
        name, _ = min(pool, key=lambda item: (not item[1].stands_badly(), bool(item[1].outcomes), item[1].heard_at))
        self._forget(name)
        self._counters.add("evicted_senders")
        return name != sender

    def _forget(self, sender: str) -> None:
        """Drop ``sender`` and count its records never fetched."""
        state = self._senders.pop(sender)
        self._lost(sender, state.refs, give_up=False)  # the book's choice, which says nothing of what it serves
        if state.origin is not None:
            known = self._by_origin.get(state.origin, set())
            known.discard(sender)
            if not known:
                self._by_origin.pop(state.origin, None)

    def _lost(self, sender: str, seqs: Iterable[int], give_up: bool = True) -> None:
        """Records of ``sender`` that will not be fetched: the ones never fetched are counted; the ones tried and
        missing are given up (``give_up``, see :meth:`record_missing`), or forgotten, unless a fetch of them is under
        way (its outcome settles them)."""
        seqs = list(seqs)
        lost = [seq for seq in seqs if (sender, seq) not in self._seen_refs and (sender, seq) not in self._in_flight]
        if lost:
            self._counters.add("heard_never_fetched", len(lost))
        for seq in seqs:
            if (sender, seq) in self._in_flight:
                continue
            tries = self._missing_tries.pop((sender, seq), None)
            if tries is not None and give_up:  # before its last try: a strike only if the sender serves little
                self._give_up(sender, answered_without=tries[1], tried_out=False)

    def _trim(self, sender: str, state: SenderState) -> None:
        """Keep the newest ``2 * index_records`` refs of a peer (the rest could never be the freshest choice)."""
        keep = 2 * self.config.index_records
        if len(state.refs) > keep:
            dropped = sorted(state.refs)[:-keep]
            self._lost(sender, dropped)
            for seq in dropped:
                state.drop_record(seq)

    def _heard(self, sender: str, state: SenderState, at: float, host: str | None) -> None:
        """Word from ``sender`` dated ``at``: it is not departed, and a rest of its host from before ends (unless it
        stands badly: a sender that keeps announcing what it never serves is not asked again at each announcement)."""
        state.heard_at = max(state.heard_at, at)
        if state.departed and not self._silent(state, self._clock.time()):
            state.departed = False
            self._counters.add("returned_senders")
            self._peer_lines.log(logging.INFO, "back", "key fingerprint %s is back", sender)
        if host is not None and not state.stands_badly():  # heard from after a failure: back
            self._hosts.heard_from(host, at)

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
            live_hosts = {state.host for state in self._senders.values() if not state.departed}
            for sender in marked:  # the records it served left with it (unless a live peer serves from its host)
                state = self._senders[sender]
                if state.host is not None and state.host not in live_hosts:
                    self._lost(sender, state.refs)
                    for ref in state.refs.values():
                        self._seen(sender, ref, now, replace=False)
        for sender in marked:
            self._counters.add("departed_senders")
            self._peer_lines.log(
                logging.INFO, "dropped", "key fingerprint %s missed %d announcements: dropped", sender,
                self.config.departed_after_missed,
            )  # fmt: skip
        return marked

    # ------------------------------------------------------------------------------ choosing and fetching

    def choose(
        self, need: int, spares: int = 0, urgent_only: bool = False, since_take: bool = True
    ) -> tuple[list[Choice], list[Choice]]:
        """Unseen fresh records to fetch for ``need`` groups, by the fair refill of :mod:`swarm.refill` (each sender's
        share bounded, the senders not judged good sharing a pool, round-robin across senders, the one whose turn came
        longest ago first, then the freshest, a date counting at most as now); and up to ``spares`` more records of
        other publishers (to hedge a slow fetch with), those of senders judged good first. ``urgent_only``: of that
        plan, only the records heard ``fetch_heard_within`` seconds ago or more (no spares): the refill would fetch
        them, and they may leave with their publisher before it is due. Records of resting hosts and senders are left
        out, and so are a departed publisher's records that left with it: those it served itself, unless another
        publisher heard from (not departed) serves from the same host. Its records stored in the DHT live on until their
        ttl and stay choosable: a publisher that announced its records and left before this reader's next refill (which
        comes once per step of its caller) would otherwise never have them read. ``need`` is the groups of the caller's
        take; ``since_take``: the records begun since the caller's last take spent of it already
        (:meth:`new_take`), so that the refills before a take fetch each sender's share once; false for a one-off
        fetch. A spare fits what is left of its sender's share."""
        config = self.config
        now, monotonic = self._clock.time(), self._clock.monotonic()
        oldest, newest = now - config.record_ttl, now + config.clock_skew_tolerance
        resting = self.resting_hosts()
        fresh_within = self._fresh_within()
        stale_before = -float("inf") if fresh_within is None else now - fresh_within
        offers: dict[str, list[Offer[Choice]]] = {}
        with self._lock:
            resting |= self._hosts.at_budget(monotonic)
            live_hosts = {state.host for state in self._senders.values() if not state.departed}
            for sender, state in self._senders.items():
                if state.host in resting or state.rest_until > monotonic:
                    continue
                if state.departed and state.host is not None and state.host not in live_hosts:
                    continue
                trusted = state.judged_good()
                mine = [
                    Offer(Choice(sender, ref, state.host, state.announced(seq)), sender, ref.num_groups,
                          min(ref.created_at, now),
                          now - state.heard.get(seq, now) >= config.fetch_heard_within, trusted, state.turn,
                          ref.created_at < stale_before, state.record_size(seq, 0))
                    for seq, ref in state.refs.items()
                    if (sender, seq) not in self._seen_refs and (sender, seq) not in self._in_flight
                    and oldest <= ref.created_at <= newest
                ]  # fmt: skip
                if mine:
                    offers[sender] = mine
            spent = self._spent_since_take() if since_take else Spent()
        order = list(offers)
        self._rng.shuffle(order)  # ties of date go to a random publisher, not always the same one
        chosen, others = plan_refill(
            {sender: offers[sender] for sender in order}, need, config.refill_sender_share,
            config.refill_unjudged_share, config.refill_group_bytes, spent,
        )  # fmt: skip
        if urgent_only:
            return [offer.item for offer in chosen if offer.urgent], []
        taken_from = {offer.sender for offer in chosen}
        spare: list[Choice] = []
        shares = caps(need, config.refill_sender_share, config.refill_unjudged_share, any(o.trusted for o in chosen))
        for offer in sorted(others, key=lambda offer: not offer.trusted):  # one per publisher, none of the chosen's
            fits = weight(offer.claimed, offer.size, config.refill_group_bytes) <= room(offer, spent, shares)
            if len(spare) < spares and offer.sender not in taken_from and fits:
                spare.append(offer.item)
                taken_from.add(offer.sender)
        return [offer.item for offer in chosen], spare

    def _spent_since_take(self) -> Spent:
        trusted = frozenset(sender for sender, state in self._senders.items() if state.judged_good())
        return Spent(dict(self._spent), trusted)

    def covered(self, need: int) -> int:
        """The groups of the caller's take of ``need`` that the records begun since its last take cover
        (:func:`swarm.refill.covered`)."""
        with self._lock:
            spent = self._spent_since_take()
        return covered(need, spent, self.config.refill_sender_share, self.config.refill_unjudged_share)

    def new_take(self, left: collections.Counter[str] | None = None) -> None:
        """The caller took groups: what its next take wants is spent by the records begun from now on, and by
        ``left``, groups of each sender still held that count towards it."""
        with self._lock:
            self._spent = collections.Counter(left or {})
            # what is under way was counted before this take; what it truly weighs beyond that counts in this one
            self._begun = dict.fromkeys(self._begun, 0)

    def fetched_size(self, sender: str, ref: RecordRef, size: int) -> None:
        """A record of ``sender`` of ``size`` bytes arrived: its sender spent what it truly weighs, if more than was
        counted when its fetch began, and the size of its records it does not announce is estimated from it."""
        with self._lock:
            state = self._senders.get(sender)
            if state is not None:
                state.group_bytes = max(state.group_bytes, -(-size // max(1, ref.num_groups)))
            key = (sender, ref.seq)
            if key in self._begun:
                counts = weight(ref.num_groups, size, self.config.refill_group_bytes)
                self._spent[sender] += counts - self._begun[key]  # what it truly weighs, above or below the estimate
                self._begun[key] = counts

    def public_key(self, sender: str) -> bytes | None:
        """``sender``'s public key, if known."""
        with self._lock:
            state = self._senders.get(sender)
            return None if state is None else state.public_key

    def fetching(self, choice: Choice, now: bool) -> None:
        """``choice`` is being fetched (``now`` True) or no longer is: meanwhile it is not chosen again. A fetch that
        begins is its sender's turn: the senders that waited longer go before it in the next refill."""
        key = (choice.sender, choice.ref.seq)
        with self._lock:
            if now:
                if key in self._in_flight:  # a spare begun while the same record is fetched: counted once
                    return
                self._in_flight.add(key)
                self._took_turn(choice.sender)
                self._spend(choice)
                if choice.host is not None:
                    self._hosts.asked(choice.host, self._clock.monotonic())
            else:
                self._in_flight.discard(key)
                counted = self._begun.pop(key, 0)
                if key in self._came_without:  # its host answered without it: nothing spent (a retry counts again)
                    self._came_without.discard(key)
                    self._spent[choice.sender] -= counted
                    if self._spent[choice.sender] <= 0:
                        del self._spent[choice.sender]

    def mark_fetched(self, sender: str, ref: RecordRef, host: str | None = None) -> None:
        """``ref`` arrived (or an answer refused is not to be asked for again): it is not chosen again, and counts as
        served; ``host`` answered."""
        with self._lock:
            self._took_turn(sender)
            state = self._senders.get(sender)
            if state is not None:
                state.served.append(True)
            self._seen(sender, ref, self._clock.time())
            self._missing_tries.pop((sender, ref.seq), None)
            if host is not None:
                self._hosts.answered(host)

    def _seen(self, sender: str, ref: RecordRef, now: float, replace: bool = True) -> None:
        """Remember ``ref`` as not to be fetched again (``replace``: even if it is remembered already), dated at most
        ``now``; over ``_SEEN_REFS_KEPT``, the oldest are forgotten down to 7/8 of it (sorted once per eighth: cheap
        per ref), and one forgotten is chosen again only if its sender still lists it, fresh."""
        key = (sender, ref.seq)
        if replace or key not in self._seen_refs:
            self._seen_refs[key] = min(ref.created_at, now)
        if len(self._seen_refs) > _SEEN_REFS_KEPT:
            oldest = sorted(self._seen_refs, key=self._seen_refs.__getitem__)
            for stale in oldest[: len(oldest) - _SEEN_REFS_KEPT * 7 // 8]:
                del self._seen_refs[stale]

    def _spend(self, choice: Choice) -> None:
        """A fetch of ``choice`` begins: its sender spends what the record counts for, of the caller's next take."""
        state = self._senders.get(choice.sender)
        size = 0  # not announced, and nothing of its sender's fetched yet: its claim, corrected when it arrives
        if choice.announced is not None:
            size = choice.announced[1]
        elif state is not None:
            size = state.record_size(choice.ref.seq, 0)
        counts = weight(choice.ref.num_groups, size, self.config.refill_group_bytes)
        self._spent[choice.sender] += counts
        self._begun[(choice.sender, choice.ref.seq)] = counts

    def _took_turn(self, sender: str) -> None:
        state = self._senders.get(sender)
        if state is not None:
            self._fetches_begun += 1
            state.turn = self._fetches_begun

    def record_missing(self, sender: str, ref: RecordRef, unreachable: bool = False) -> None:
        """Not there yet (a store still travelling), lost, or its host did not answer (``unreachable``): retried a
        few polls, then given up (counted as ``records_missing`` and ``heard_never_fetched``). Given up after an
        answer without it at any of its tries (the host did not serve it, no DHT replica had it), it is a strike of its
        sender (``never_served``); a host that could not be reached says nothing of the sender (the network, or it
        left). A record tried and missing that leaves its sender's list before its last try (pushed out by newer ones,
        expired, its sender departed) is given up without a strike (a fast honest publisher may no longer serve an
        old record by the time a reader asks; its tries were kept for good before), unless its sender serves little
        (:meth:`SenderState.serves_little`: one that announces more records than it serves, so that each is pushed
        out before its last try, is struck all the same)."""
        key = (sender, ref.seq)
        with self._lock:
            if not unreachable and key in self._begun:
                self._came_without.add(key)
            tries, unserved = self._missing_tries.pop(key, (0, False))
            tries, unserved = tries + 1, unserved or not unreachable
            listed = self._listed(key)
            if tries < _MISSING_TRIES and listed:
                self._missing_tries[key] = (tries, unserved)  # last in the order: the one tried most recently
                if len(self._missing_tries) > _MISSING_KEPT:
                    oldest = next(iter(self._missing_tries))
                    del self._missing_tries[oldest]
                    self._give_up(oldest[0], answered_without=False, tried_out=False)  # this reader's bound
                return
            if listed or key not in self._seen_refs:  # else _lost counted it, or it was fetched
                self._counters.add("heard_never_fetched")
            self._seen(sender, ref, self._clock.time())
            self._give_up(sender, answered_without=unserved, tried_out=tries >= _MISSING_TRIES)

    def _listed(self, key: tuple[str, int]) -> bool:
        """Whether record ``key`` (sender, seq) is still in its sender's list and not set aside as seen."""
        state = self._senders.get(key[0])
        return state is not None and key[1] in state.refs and key not in self._seen_refs

    def _give_up(self, sender: str, answered_without: bool, tried_out: bool) -> None:
        """A record of ``sender`` tried and missing is not tried again: counted as ``records_missing``. If an answer
        came without it, it counts as not served, and is a strike (``never_served``) when it was tried out or the
        sender serves little."""
        self._counters.add("records_missing")
        if not answered_without:
            return
        state = self._senders.get(sender)
        if state is not None:
            state.served.append(False)
        if tried_out or (state is not None and state.serves_little()):
            self._strike(sender, "never_served")

    def rest(self, host: str, sender: str | None = None) -> None:
        """A request to ``host`` (serving ``sender``'s records) failed: its records are not chosen for a while (see
        the module docstring) or until it is heard from again."""
        with self._lock:
            state = self._senders.get(sender) if sender is not None else None
            retry_after = self.config.fetch_retry_after if state is not None and state.judged_good() else None
            self._hosts.failed(host, retry_after, self._clock.monotonic(), self._clock.time())

    def resting_hosts(self) -> set[str]:
        """Hosts whose last request failed within their rest and that were not heard from since."""
        with self._lock:
            return self._hosts.resting(self._clock.monotonic())

    # ------------------------------------------------------------------------------ standing

    def judge(self, sender: str, usable: bool) -> None:
        """The node's verdict on one group of ``sender``: usable (it was trained on) or bad (refused by a check). A
        sender whose latest outcomes are mostly usable is judged good (:meth:`SenderState.judged_good`)."""
        with self._lock:
            state = self._senders.get(sender)
            if state is not None:
                state.outcomes.append(usable)

    def strike(self, sender: str, reason: str) -> None:
        """A record of ``sender`` was refused (``reason``: the rejection's) or never served: it counts against the
        sender (counted as ``sender_strikes``), rests it, and is handed to the node by :meth:`refusals`."""
        with self._lock:
            self._strike(sender, reason)

    def _strike(self, sender: str, reason: str) -> None:
        self._refusals.append((sender, reason))
        state = self._senders.get(sender)
        if state is not None:
            state.outcomes.append(False)
            strikes = state.outcomes.count(False)
            seconds = min(LONGEST_REST_SECONDS, self.config.fetch_retry_after * 2 ** (strikes - 1))
            state.rest_until = self._clock.monotonic() + seconds
        self._counters.add("sender_strikes")

    def bench(self, sender: str, seconds: float) -> None:
        """The node benched ``sender`` for ``seconds`` (it sets the sender's groups aside unread meanwhile): its records
        are not chosen for as long, so that they take no room of a refill (:meth:`resting` says True), even if the
        book forgets the sender and hears of it again meanwhile."""
        now = self._clock.monotonic()
        with self._lock:
            until = max(self._benched.pop(sender, 0.0), now + seconds)
            self._benched = {other: end for other, end in self._benched.items() if end > now}
            self._benched[sender] = until
            if len(self._benched) > _BENCHES_KEPT:  # the bench ending first is forgotten first
                del self._benched[min(self._benched, key=self._benched.__getitem__)]
            state = self._senders.get(sender)
            if state is not None:
                state.rest_until = max(state.rest_until, until)

    def refusals(self) -> list[tuple[str, str]]:
        """The strikes since the last call, as ``(sender, reason)``, oldest first (at most ``_REFUSALS_KEPT``)."""
        with self._lock:
            taken = list(self._refusals)
            self._refusals.clear()
        return taken

    def standing(self, sender: str) -> str:
        """``"good"`` (judged good), ``"bad"`` (stands badly), ``"unjudged"``, or ``"unknown"`` (not in the book)."""
        with self._lock:
            state = self._senders.get(sender)
            if state is None:
                return "unknown"
            return "good" if state.judged_good() else "bad" if state.stands_badly() else "unjudged"

    def resting(self, sender: str) -> bool:
        """True while ``sender``'s records are not chosen: it rests after a strike or while benched, or its host after
        a failure."""
        resting = self.resting_hosts()
        with self._lock:
            state = self._senders.get(sender)
            return state is not None and (state.rest_until > self._clock.monotonic() or state.host in resting)

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
            for sender in [s for s, state in self._senders.items() if max(state.last_seen, state.heard_at) < horizon]:
                self._forget(sender)
            for sender, state in self._senders.items():  # expired records of the peers still heard from
                expired = [seq for seq, ref in state.refs.items() if ref.created_at < horizon]
                self._lost(sender, expired)
                for seq in expired:
                    state.drop_record(seq)
            for ref in [ref for ref, created_at in self._seen_refs.items() if created_at < horizon]:
                del self._seen_refs[ref]
            # what _lost and record_missing left: a fetch of a ref no longer listed that never reported back
            for key in [key for key in self._missing_tries if key not in self._in_flight and not self._listed(key)]:
                del self._missing_tries[key]
            self._hosts.forget_all_but({state.host for state in self._senders.values()})

    def gauges(self) -> dict[str, float]:
        """Peers known, departed, judged good and not (``unknown_senders``, the bounded part of the book), refs
        remembered as fetched."""
        with self._lock:
            good = sum(state.judged_good() for state in self._senders.values())
            return {
                "known_senders": float(len(self._senders)),
                "departed_senders": float(sum(state.departed for state in self._senders.values())),
                "good_senders": float(good),
                "unknown_senders": float(len(self._senders) - good),
                "seen_refs": float(len(self._seen_refs)),
            }
