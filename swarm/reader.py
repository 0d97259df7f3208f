"""The reading side of a DHT peer: take announcements and index entries, fetch the freshest records just before the
next step needs them, and hand their groups out newest first.

:class:`SwarmReader` knows the swarm only through an object with hivemind's ``get_many`` (a
:class:`~hivemind.dht.node.DHTNode`, or a dictionary-backed stand-in in unit tests), a lookup of served records, and
the announcements its peer's subscription hands it (:meth:`SwarmReader.take_announcement`); it reads time from an
injected :class:`~swarm.clock.Clock`, so expiry, clock skew, departures and the timing of refills are tested without
a p2pd daemon. It composes what other peers are known to hold (:mod:`swarm.senders`), the index reads
(:mod:`swarm.index_reader`) and the fetches (:mod:`swarm.fetcher`).

Freshest first, refilled just in time:

- :meth:`SwarmReader.take` hands out the newest cached groups first;
- the cache is refilled once per step of its caller: from the caller's last few :meth:`~SwarmReader.take` calls the
  reader learns their interval and size, and fetches that many groups' worth of the freshest records known (every
  publisher's newest first, across publishers: :meth:`swarm.senders.SenderBook.choose`) a lead time before the next
  call is due (``refill_lead``, or twice the hedge time of a fetch if longer). Before it knows the caller's pace,
  it keeps ``prefetch_groups`` cached. Groups fetched but not taken stay behind the fresher ones, as a reserve.
- the refill is fair (:mod:`swarm.refill`): what a sender claims (its record's group count, its date) never takes
  more than its share, and senders not yet judged good (:meth:`SwarmReader.judge`) share a small pool;
- a served record lives only while its publisher serves it: a record the next refill would fetch that was heard
  ``fetch_heard_within`` seconds ago is fetched at once, rather than at the refill just before the caller's next
  call (its publisher may have left by then); it counts towards that refill. Records heard and never fetched are
  counted (``heard_never_fetched``).

What a reader costs per step does not grow with the swarm's size N: records fetched are those taken (O(J)); an
announcement topic carries about ``topic_peers`` publishers (:mod:`swarm.levels`); the index is read every
``index_refresh_interval`` (every ``index_min_interval`` while the refills before the caller's next take want groups
and no announcement arrives, and once more just after joining), a few entries per read. :meth:`SwarmReader.peers`
lists the peers heard from (the topic's and those index reads listed) within the record ttl, not the whole swarm. A
peer that publishes nothing is listed once an index read finds its entry (rewritten every ``announce_interval``) or
its "still here" announcement arrives (one per ``announce_interval``), so within one ``announce_interval``; in a small
swarm within about ``index_min_interval`` of joining, since a joining reader whose first read found nobody reads level
0 whole ``index_min_interval`` later whether or not other peers' announcements arrive meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import random
import statistics
import threading
from collections.abc import Callable
from typing import Any

from swarm.announcement_gate import Taken
from swarm.announcements import decode_announcement
from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.config import DHTTransportConfig
from swarm.fetcher import DHTLookup, ReasonedRejections, RecordFetcher
from swarm.index_reader import IndexReader
from swarm.levels import home_topic_shard, subscribed_shards, topic_level_for
from swarm.log_lines import PeerLines
from swarm.records import ReceivedGroup, RecordRef, RecordRejected, decode_record
from swarm.refill import Offer, fair_take, fresh_window
from swarm.repeats import RecentMessages
from swarm.senders import SenderBook
from swarm.served import ServedLookup
from swarm.transport import PeerInfo, SwarmCounters, TimingLog
from swarm.validation import RejectionLog, fingerprint, owner_public_key

logger = logging.getLogger(__name__)

_RETURNED_IDS_KEPT = 100_000  # ids of groups handed out, so a record fetched twice is not trained on twice
_TAKES_KEPT = 6  # take() calls whose interval and size make the caller's pace
_SPARES = 2  # records of other publishers held ready to hedge a slow fetch with
_SKEW_WARNINGS_KEPT = 10_000  # senders warned about their clock (each once)
_SKEW_WARNING_EVERY = 60.0  # seconds between two clock warnings: a line per identity would fill the log
MODEL_NAME_LOGGED = 64  # characters of a peer's model name in a log line (the field holds up to 1024 of its choice)
_JOINING_READS = 2  # index reads a joining reader does whatever arrives: its guess of the level, then level 0 whole


class SwarmReader:
    """Keeps fresh, validated groups of other peers ready; :meth:`take` hands them out once each, newest first.

    Thread-safe: :meth:`poll` and :meth:`take_announcement` run on the transport's event loop, :meth:`take` and
    :meth:`peers` in any thread.

    Args:
        config: the transport's settings (intervals, ttl, cache sizes, limits).
        own_public_key: this peer's key; its own entries and announcements are skipped.
        counters: where fetches and rejections are counted.
        timings: where lookup durations are recorded.
        clock: wall time dates records; monotonic time spaces index reads and times refills.
        rng: where the rotation over index shards starts.
        served: fetches the records of peers that serve their own and checks them; ``None``: every record is looked
            up in the DHT.
        admits: whether a peer id may take part (a closed swarm's membership); ``None``: everyone.
        prior: a rough estimate of the swarm's size from elsewhere (the DHT's routing table), used before the index
            yields one.
        validator_rejections: where the validator that opens served records counts refusals with their reasons
            (a refused record strikes its sender with its reason: :class:`~swarm.fetcher.RecordFetcher`).
    """

    def __init__(
        self,
        config: DHTTransportConfig,
        own_public_key: bytes,
        counters: SwarmCounters,
        timings: TimingLog,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        served: ServedLookup | None = None,
        admits: Callable[[str], bool] | None = None,
        prior: Callable[[], float | None] = lambda: None,
        validator_rejections: ReasonedRejections | None = None,
    ):
        self.config = config
        self._own_public_key = own_public_key
        self._label = fingerprint(own_public_key)  # this peer, in log lines
        self._counters = counters
        self._reject = RejectionLog(counters)
        self._timings = timings
        self._clock = clock
        self._admits = admits or (lambda sender: True)
        self._lock = threading.Lock()
        rng = rng or random.Random()
        self.book = SenderBook(config, counters, clock, rng, fresh_within=self._fresh_within)
        self.index = IndexReader(
            config, counters, timings, clock, rng, on_entry=self._take_index_entry, prior=prior, topic=self.topic
        )
        self.fetcher = RecordFetcher(
            config, self.book, served, counters, timings, clock, self._take_value, validator_rejections
        )
        self._cache: list[ReceivedGroup] = []
        self._returned: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._takes: collections.deque[tuple[float, int]] = collections.deque(maxlen=_TAKES_KEPT)  # (monotonic, n)
        self._announcements_seen = RecentMessages()
        self._skew_warned: collections.OrderedDict[str, None] = collections.OrderedDict()  # warned once each
        self._skew_lines = PeerLines(logger, clock.monotonic, interval=_SKEW_WARNING_EVERY, burst=1)
        self._peer_lines = PeerLines(logger, clock.monotonic)  # peers found or heard from: 10 lines a minute at most
        self._last_index_read = -float("inf")
        self._last_announcement = -float("inf")  # monotonic time of the latest valid announcement
        self._listening: tuple[int, frozenset[int]] | None = None  # topic level and shards listened to...
        self._listening_since = 0.0  # ...since this wall time

    # ------------------------------------------------------------------------------ any thread

    def take(self, max_groups: int) -> list[ReceivedGroup]:
        """Up to ``max_groups`` cached groups, newest first, never handed out before; never waits.

        The groups are shared out by the refill's rules (:func:`swarm.refill.fair_take`): every sender within its
        share of the take, the senders not judged good within their pool, then whatever is left of the take to
        anyone; so a sender whose records truly hold many groups, or are dated a little ahead, takes no more than its
        share while other senders' groups wait. Groups made within the caller's fresh window (its step, or
        ``fetch_heard_within`` if longer) go before older ones. Groups older than the record ttl are dropped (counted
        as ``rejected/expired``).
        """
        if max_groups <= 0:
            return []
        with self._lock:
            senders = {item.sender for item in self._cache}
        good = {sender for sender in senders if self.book.standing(sender) == "good"}  # the book's lock, not ours
        fresh_within = self._fresh_within()
        now = self._clock.time()
        with self._lock:
            fresh = []
            for item in self._cache:
                if now - item.group.created_at > self.config.record_ttl:
                    self._counters.reject("expired")
                else:
                    fresh.append(item)
            fresh.sort(key=lambda item: -min(item.group.created_at, now))  # no precedence for a date ahead of ours
            by_sender: dict[str, list[Offer[ReceivedGroup]]] = {}
            for item in fresh:
                date = min(item.group.created_at, now)
                stale = fresh_within is not None and now - date > fresh_within
                offer = Offer(item, item.sender, 1, date, False, item.sender in good, stale=stale)
                by_sender.setdefault(item.sender, []).append(offer)
            config = self.config
            chosen = fair_take(by_sender, max_groups, config.refill_sender_share, config.refill_unjudged_share)
            taken_ids = {id(offer.item) for offer in chosen}
            taken = [item for item in fresh if id(item) in taken_ids]
            self._cache = [item for item in fresh if id(item) not in taken_ids]
            for item in taken:
                self._returned[_group_id(item)] = None
            while len(self._returned) > _RETURNED_IDS_KEPT:
                self._returned.popitem(last=False)
            self._takes.append((self._clock.monotonic(), max_groups))
            # until the caller's pace is known (two takes) its takes want prefetch_groups less what is held; then
            # what it takes (the book's lock is never held while it asks for this one)
            left = collections.Counter(item.sender for item in self._cache) if len(self._takes) < 2 else None
            self.book.new_take(left)
        self._counters.add("fetched_groups", len(taken))
        return taken

    def cached_groups(self) -> int:
        """Groups held for :meth:`take` (some may expire before they are taken)."""
        with self._lock:
            return len(self._cache)

    def peers(self) -> list[PeerInfo]:
        """Other peers heard from (announcements, index entries) within the record ttl, departed ones left out."""
        return self.book.peers()

    def estimated_peers(self) -> float | None:
        """The number of peers listed in the index, estimated from the last few index reads; ``None`` before a read
        found entries."""
        return self.index.estimated_peers()

    def read_level(self) -> int:
        """The index level the next index read reads."""
        return self.index.read_level()

    def write_levels(self) -> range:
        """The index levels this peer's publisher writes its entry to."""
        return self.index.write_levels()

    def topic_level(self) -> int:
        """The announcement topic level of this peer (:func:`swarm.levels.topic_level_for` of its size estimate)."""
        return topic_level_for(self.index.size_estimate(), self.config)

    def topic(self) -> tuple[int, int] | None:
        """This peer's home announcement topic as ``(shard, level)``; ``None`` without announcements."""
        if not self.config.gossip:
            return None
        level = self.topic_level()
        return home_topic_shard(self._label, level), level

    def gauges(self) -> dict[str, float]:
        """Sizes of what the reader holds, its estimate of the swarm's size (-1 before one), the index level it reads,
        its topic level, the caller's pace it learnt (-1 before it did) and the wait before a fetch is hedged."""
        estimate = self.estimated_peers()
        pace = self.pace()
        with self._lock:
            gauges = {"cached_groups": float(len(self._cache)), "returned_ids": float(len(self._returned))}
        return {
            **gauges,
            **self.book.gauges(),
            "estimated_peers": -1.0 if estimate is None else estimate,
            "index_level": float(self.read_level()),
            "topic_level": float(self.topic_level()),
            "step_seconds": -1.0 if pace is None else pace[0],
            "hedge_after_seconds": self.fetcher.hedge_after(),
        }

    # ------------------------------------------------------------------------------ when to refill

    def pace(self) -> tuple[float, int] | None:
        """The caller's pace: the median seconds between its recent :meth:`take` calls and the groups its last one
        asked for; ``None`` before two calls."""
        with self._lock:
            takes = list(self._takes)
        if len(takes) < 2:
            return None
        gaps = [later - earlier for (earlier, _), (later, _) in zip(takes, takes[1:], strict=False)]
        return statistics.median(gaps), takes[-1][1]

    def _fresh_within(self) -> float | None:
        """Seconds within which a record counts as fresh (:func:`swarm.refill.fresh_window` of the caller's pace);
        ``None`` before the pace is known."""
        pace = self.pace()
        return fresh_window(None if pace is None else pace[0], self.config.fetch_heard_within)

    def refill_lead(self) -> float:
        """Seconds before the caller's next :meth:`take` is due at which the cache is refilled."""
        return max(self.config.refill_lead, 2 * self.fetcher.hedge_after())

    def until_refill(self) -> float:
        """Seconds until the next refill is due (0: now; always 0 before the caller's pace is known)."""
        pace = self.pace()
        if pace is None:
            return 0.0
        with self._lock:
            last_take = self._takes[-1][0]
        due = last_take + pace[0] - self.refill_lead()
        return max(0.0, due - self._clock.monotonic())

    def need(self) -> int:
        """The groups the caller's next take wants: what its last take asked for; before its pace is known,
        ``prefetch_groups``."""
        pace = self.pace()
        return self.config.prefetch_groups if pace is None else pace[1]

    def wanted(self) -> int:
        """Groups the refills before the caller's next take still want: :meth:`need` less what the records whose
        fetch began since its last take count for (before its pace is known, the groups held at that take too), as
        the refill counts them (:meth:`swarm.senders.SenderBook.covered`): a record for the groups it holds or its
        bytes weigh (:func:`swarm.refill.weight`), each sender up to its share (`refill_sender_share`; of the pool,
        for one not judged good), so that a record truly holding many groups, or many bytes, does not end the
        refills before other senders' records are fetched, and a sender's share is fetched once."""
        need = self.need()
        return need - self.book.covered(need)

    # ------------------------------------------------------------------------------ the event loop

    async def poll(self, dht: DHTLookup) -> None:
        """One background round: mark departed peers, read the index when due, refill the cache when due."""
        self._mark_departures()
        wanted = self.wanted()
        since = self._clock.monotonic() - self._last_index_read
        # With announcements, fresh records arrive without the index: it is read for more only while none arrives
        # (a peer that has just joined, or whose topic is silent).
        config = self.config
        quiet = config.departed_after_missed * config.announce_interval + config.clock_skew_tolerance
        silent = self._clock.monotonic() - self._last_announcement > quiet
        starving = wanted > 0 and (not self.config.gossip or silent)
        # A joining reader whose first read (a guess of the level) found nobody reads again index_min_interval later
        # whatever arrives meanwhile: that second read probes level 0 whole, where the peers of a small swarm write.
        # The first announcement of one peer says nothing of the peers that publish nothing (a bootstrap peer says
        # "still here" once per announce_interval), which only the index lists; putting the second read off until
        # index_refresh_interval because of that announcement left them unlisted meanwhile.
        joining = self.index.reads < _JOINING_READS and self.index.estimated_peers() is None
        due_early = (starving or joining) and since >= config.index_min_interval
        if since >= config.index_refresh_interval or due_early:
            self._last_index_read = self._clock.monotonic()
            self.forget_expired()
            await self.index.read(dht)
        wait = self.until_refill()
        if wanted <= 0:
            return
        if wait > self.config.poll_interval:
            # Not due yet; but a record of the refill's plan heard fetch_heard_within ago may leave with its publisher
            # before the refill: fetch those now (they count towards it).
            chosen, spares = self.book.choose(self.need(), _SPARES, urgent_only=True)
            if chosen:
                await self.fetcher.fetch(dht, chosen, spares)
            return
        await asyncio.sleep(wait)  # due within this poll: at the moment it is due, not up to a poll late
        if self.wanted() > 0:
            chosen, spares = self.book.choose(self.need(), _SPARES)
            await self.fetcher.fetch(dht, chosen, spares)

    def _mark_departures(self) -> None:
        """Mark as departed the peers of the topics this peer listens to that missed their announcements (peers of
        topics it just started to listen to have their announcement periods from then on)."""
        if not self.config.gossip:
            self.book.mark_departures()
            return
        level = self.topic_level()
        listening = (level, frozenset(subscribed_shards(self._label, level, self.config)))
        if listening != self._listening:
            self._listening, self._listening_since = listening, self._clock.time()
        shards = listening[1]
        self.book.mark_departures(lambda sender: home_topic_shard(sender, level) in shards, self._listening_since)

    async def read_index(self, dht: DHTLookup) -> None:
        """Read the next index shards now (see :mod:`swarm.index_reader`)."""
        self._last_index_read = self._clock.monotonic()
        await self.index.read(dht)

    def choose_refs(self, need: int) -> list[tuple[str, RecordRef]]:
        """The records the next fetch for ``need`` groups would fetch, as ``(sender, ref)``, freshest first."""
        return [(choice.sender, choice.ref) for choice in self.book.choose(need, since_take=False)[0]]

    async def fetch_records(self, dht: DHTLookup, need: int) -> None:
        """Fetch the freshest records known for ``need`` groups now, whatever the caller's pace."""
        chosen, spares = self.book.choose(need, _SPARES, since_take=False)
        await self.fetcher.fetch(dht, chosen, spares)

    def forget_expired(self) -> None:
        """Drop bookkeeping about records and peers older than the record ttl (memory stays bounded)."""
        self.book.forget_expired()

    def judge(self, sender: str, usable: bool) -> None:
        """The node's verdict on one group of ``sender`` (:meth:`swarm.senders.SenderBook.judge`)."""
        self.book.judge(sender, usable)

    def bench(self, sender: str, seconds: float) -> None:
        """The node benched ``sender`` for ``seconds`` (:meth:`swarm.senders.SenderBook.bench`)."""
        self.book.bench(sender, seconds)

    def refusals(self) -> list[tuple[str, str]]:
        """Strikes since the last call, ``(sender, reason)`` (:meth:`swarm.senders.SenderBook.refusals`)."""
        return self.book.refusals()

    # ------------------------------------------------------------------------------ what arrives

    def take_announcement(self, data: bytes, from_host: str) -> Taken:
        """Take one announcement that libp2p peer ``from_host`` published: :data:`Taken.TAKEN` (truthy) if it was
        valid and of another peer, else why not. Every refusal is counted under ``rejected/<reason>``; one arriving
        again byte for byte from the same publisher (among the last 8192 distinct ones) is dropped unread and counted
        as ``announcements_repeated`` (:data:`Taken.REPEATED`)."""
        config = self.config
        with self._lock:
            # by its publisher too: another peer's copy of an honest announcement must not shadow the original
            repeated = self._announcements_seen.repeated(from_host.encode() + b"\0" + data)
        if repeated:  # a copy says nothing new: dropped before its signature is checked again
            self._counters.add("announcements_repeated")
            return Taken.REPEATED
        try:
            announcement = decode_announcement(data, config.swarm_name, config.limits)
        except RecordRejected as e:
            self._reject(e.reason, f"announcement from {from_host}: {e.detail}")
            return Taken.REFUSED
        sender = announcement.sender
        if announcement.public_key == self._own_public_key:
            return Taken.OWN
        if announcement.host is not None and announcement.host != from_host:
            self._reject(
                "wrong_host", f"announcement of {sender} naming host {announcement.host} came from {from_host}"
            )
            return Taken.REFUSED
        if not self._admits(sender):
            self._reject("not_member", f"announcement of {sender}, not a member of this closed swarm")
            return Taken.REFUSED
        now = self._clock.time()
        if announcement.updated_at > now + config.clock_skew_tolerance:
            self._clock_skew(sender, announcement.updated_at - now)
            return Taken.REFUSED
        if now - announcement.updated_at > config.record_ttl:
            self._reject("expired", f"announcement of {sender} is {now - announcement.updated_at:.0f} s old")
            return Taken.REFUSED
        new = self.book.take_announcement(announcement, from_host)
        if new is None:  # one host announcing identity after identity (refused and counted by the book)
            return Taken.REFUSED
        if new:
            self._peer_lines.log(
                logging.INFO, "found", "key fingerprint %s heard from key fingerprint %s (model %r)", self._label,
                sender, announcement.model[:MODEL_NAME_LOGGED],
            )  # fmt: skip
        self._last_announcement = self._clock.monotonic()
        self._counters.add("announcements_received")
        return Taken.TAKEN

    def _take_index_entry(self, subkey: Any, value: Any, now: float) -> bool:
        """Take one index entry; True if it is a valid entry of a peer (this one's included), which counts towards
        the estimate of the swarm's size."""
        public_key = owner_public_key(subkey)
        if public_key is None:
            return False
        if public_key == self._own_public_key:
            return True
        sender = fingerprint(public_key)
        if not self._admits(sender):
            self.index.remember_rejected(self.index.digest_of(subkey, value))
            self._reject("not_member", f"index entry of {sender}, not a member of this closed swarm")
            return False
        entry = self.index.decode(subkey, value, self._reject, sender)
        if entry is None:
            return False
        if entry.updated_at > now + self.config.clock_skew_tolerance:
            self.index.remember_rejected(self.index.digest_of(subkey, value))
            self._clock_skew(sender, entry.updated_at - now)
            return False
        if self.book.take_index_entry(sender, public_key, entry):
            self._peer_lines.log(
                logging.INFO, "found", "key fingerprint %s found key fingerprint %s (model %r)", self._label, sender,
                entry.model[:MODEL_NAME_LOGGED],
            )  # fmt: skip
        return True

    def _take_value(self, sender: str, ref: RecordRef, value: Any) -> None:
        """Decode one record of ``sender`` (its signature already checked) and cache its fresh groups; a record
        refused is a strike of its sender (:meth:`swarm.senders.SenderBook.strike`), and so is one that does not hold
        the groups its sender claimed for it (``claim_mismatch``: the claim scheduled the refill)."""
        config = self.config
        self._counters.add("fetched_bytes", len(value) if isinstance(value, bytes) else 0)
        try:
            record = decode_record(value, config.limits)
        except RecordRejected as e:
            self._reject(e.reason, f"record of {sender}: {e.detail}")
            self.book.strike(sender, e.reason)
            return
        if len(record.groups) != ref.num_groups:
            self._reject("claim_mismatch", f"record {ref.seq} of {sender} holds {len(record.groups)} groups, "
                                           f"claimed {ref.num_groups}")  # fmt: skip
            self.book.strike(sender, "claim_mismatch")
            return
        now = self._clock.time()
        if record.created_at > now + config.clock_skew_tolerance:
            self._clock_skew(sender, record.created_at - now)
            self.book.strike(sender, "clock_skew")
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
        if accepted:
            # Delivery latency: from the sender's publication (its record's date) to the groups being ready here.
            self._timings.record("delivery", max(0.0, now - record.created_at))
        with self._lock:
            for item in accepted:
                if _group_id(item) not in self._returned:
                    self._cache.append(item)
            if len(self._cache) > config.max_cached_groups:
                self._cache = _evicted(self._cache, len(self._cache) - config.max_cached_groups, now)
            chars = sum(map(_group_chars, self._cache))
            if chars > config.max_cached_chars:
                self._cache = _evicted(self._cache, chars - config.max_cached_chars, now, size=_group_chars)
        self._counters.add("received_groups", len(accepted))

    def _clock_skew(self, sender: str, ahead: float) -> None:
        """Count a record or announcement of ``sender`` dated ``ahead`` seconds in the future, and warn of a sender
        not warned of before: one line at most every :data:`_SKEW_WARNING_EVERY` seconds, counting the senders found
        ahead meanwhile (identities are free: a line each would let one peer fill the log)."""
        self._reject("clock_skew", f"key fingerprint {sender} is {ahead:.1f} s in the future")
        if sender in self._skew_warned:
            return
        self._skew_warned[sender] = None
        while len(self._skew_warned) > _SKEW_WARNINGS_KEPT:  # identities are free: the memory of them is bounded
            self._skew_warned.popitem(last=False)
        self._skew_lines.log(
            logging.WARNING, "clock_skew",
            "key fingerprint %s: records of key fingerprint %s are dated %.1f s in the future: the clocks of the two "
            "machines differ (hivemind peers whose clocks differ by more than 3 s fail to interact); sync them (NTP)",
            self._label, sender, ahead,
        )  # fmt: skip


def _evicted(
    cache: list[ReceivedGroup], excess: int, now: float, size: Callable[[ReceivedGroup], int] = lambda item: 1
) -> list[ReceivedGroup]:
    """``cache`` less groups of ``excess`` ``size`` in all (by default, ``excess`` groups): each time the oldest of the
    sender holding the most (a date ahead of ``now`` counting as now), so that one sender's many groups, its large
    ones, or groups dated ahead, never push out other senders'."""
    by_sender: dict[str, collections.deque[ReceivedGroup]] = {}
    for item in sorted(cache, key=lambda item: min(item.group.created_at, now)):
        by_sender.setdefault(item.sender, collections.deque()).append(item)  # each sender's oldest first
    held = {sender: sum(map(size, items)) for sender, items in by_sender.items()}
    dropped: set[int] = set()
    while excess > 0:
        sender = max(held, key=held.__getitem__)
        item = by_sender[sender].popleft()
        dropped.add(id(item))
        held[sender] -= size(item)
        excess -= size(item)
        if not by_sender[sender]:
            del held[sender]
    return [item for item in cache if id(item) not in dropped]


def _group_chars(item: ReceivedGroup) -> int:
    """The characters of a cached group's text: its prompt's and its completions'."""
    group = item.group
    return sum(len(message.get("content") or "") for message in group.prompt) + sum(map(len, group.completions))


def _group_id(item: ReceivedGroup) -> bytes:
    """A group's identity among those handed out (sender, group id, creation time), as a 16-byte digest: a group id
    is the sender's to choose, up to `max_field_chars`, and the reader keeps :data:`_RETURNED_IDS_KEPT` of them."""
    group = item.group
    return hashlib.blake2b(repr((item.sender, group.group_id, group.created_at)).encode(), digest_size=16).digest()
