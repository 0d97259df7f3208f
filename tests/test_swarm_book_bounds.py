"""What a reader remembers of records (not to fetch again, retries of missing ones) stays bounded whatever the
records' dates and however their senders come and go, on the reader's book alone with an injected clock."""

from __future__ import annotations

import swarm.senders
from swarm.announcements import AnnouncedRecord, Announcement
from swarm.clock import ManualClock
from swarm.config import DHTTransportConfig
from swarm.records import RecordRef
from swarm.senders import SenderBook
from swarm.transport import SwarmCounters


def _announce(book: SenderBook, sender: str, now: float, *records: tuple[int, float], host: str = "") -> None:
    """``sender`` announces records ``(seq, created_at)`` of one group each, served from ``host`` (default: its own)."""
    host = host or f"host-of-{sender}"
    announced = tuple(AnnouncedRecord(seq, at, 1, 100, b"d" * 32) for seq, at in records)
    book.take_announcement(Announcement(sender, b"key-" + sender.encode(), "m", now, host, announced), origin=host)


def test_records_of_a_departed_sender_dated_far_ahead_are_forgotten_after_the_ttl():
    # An announcement's record dates are only checked to be numbers >= 0: a sender dating its records 1e12, then
    # going silent to be marked departed, again and again, had each ref remembered for good (pruned by its own date).
    clock = ManualClock()
    config = DHTTransportConfig()
    book = SenderBook(config, SwarmCounters(), clock)
    seq = 0
    for _ in range(3):  # three departures and returns
        for _ in range(4):  # announcements 10 s apart: a period of 10 s
            _announce(book, "ahead", clock.time(), *((seq := seq + 1, 1e12) for _ in range(4)))
            clock.advance(10.0)
        clock.advance(30.0)  # silent past two periods and the tolerance: departed, its refs not to be fetched
        assert book.mark_departures() == ["ahead"]
    assert book.gauges()["seen_refs"] == 16 * 3 > 0  # 16 refs each time (the newest 2 * index_records kept)
    clock.advance(config.record_ttl + config.clock_skew_tolerance + 1.0)
    book.forget_expired()
    assert book.gauges()["seen_refs"] == 0


def test_records_remembered_as_fetched_stay_within_their_bound_the_oldest_forgotten_first(monkeypatch):
    monkeypatch.setattr(swarm.senders, "_SEEN_REFS_KEPT", 100)
    clock = ManualClock()
    book = SenderBook(DHTTransportConfig(), SwarmCounters(), clock)
    now = clock.time()
    for n in range(300):  # 300 senders' records, fetched oldest first
        book.mark_fetched(f"sender-{n}", RecordRef(1, now - 300 + n, 1))
    assert book.gauges()["seen_refs"] <= 100
    # the oldest was forgotten (fetched again if its sender still lists it), the newest is still not to be fetched
    _announce(book, "sender-0", now, (1, now - 300))
    _announce(book, "sender-299", now, (1, now - 1))
    assert [choice.sender for choice in book.choose(4)[0]] == ["sender-0"]


def test_a_record_fetched_dated_ahead_is_forgotten_a_ttl_after_its_fetch():
    clock = ManualClock()
    config = DHTTransportConfig()
    book = SenderBook(config, SwarmCounters(), clock)
    book.mark_fetched("ahead", RecordRef(1, clock.time() + 2.0, 1))  # dated ahead, within the tolerance
    clock.advance(config.record_ttl + config.clock_skew_tolerance + 1.0)
    book.forget_expired()
    assert book.gauges()["seen_refs"] == 0


def test_a_record_tried_missing_then_pushed_out_by_newer_ones_leaves_no_retry_behind_and_no_strike():
    # A sender announcing 16 fresh records a second had each tried once and pushed out of its list before a second
    # try: its tries were kept for good. Now they go with the record, counted as missing; a strike needs the last try
    # (a fast honest publisher may no longer serve an old record by the time a reader asks).
    clock = ManualClock()
    book = SenderBook(DHTTransportConfig(), SwarmCounters(), clock)
    now = clock.time()
    for sender in ("unserving", "unreachable"):
        _announce(book, sender, now, (1, now))
    book.record_missing("unserving", RecordRef(1, now, 1))  # its host answered without it
    book.record_missing("unreachable", RecordRef(1, now, 1), unreachable=True)
    for sender in ("unserving", "unreachable"):
        _announce(book, sender, now, *((seq, now) for seq in range(2, 18)))  # 16 newer: record 1 pushed out
    assert book.refusals() == []
    assert book._missing_tries == {}


def test_retries_of_a_forgotten_senders_records_are_forgotten_with_it():
    clock = ManualClock()
    config = DHTTransportConfig()
    book = SenderBook(config, SwarmCounters(), clock)
    now = clock.time()
    _announce(book, "gone", now, (1, now), (2, now))
    book.record_missing("gone", RecordRef(1, now, 1))
    book.record_missing("gone", RecordRef(2, now, 1), unreachable=True)
    clock.advance(config.record_ttl + config.clock_skew_tolerance + 1.0)
    book.forget_expired()
    assert book.senders() == [] and book._missing_tries == {}


def test_retries_of_missing_records_stay_within_their_bound(monkeypatch):
    monkeypatch.setattr(swarm.senders, "_MISSING_KEPT", 100)
    clock = ManualClock()
    book = SenderBook(DHTTransportConfig(max_unknown_senders=1000), SwarmCounters(), clock)
    now = clock.time()
    for n in range(300):
        _announce(book, f"sender-{n}", now, (1, now))
        book.record_missing(f"sender-{n}", RecordRef(1, now, 1))
    assert len(book._missing_tries) == 100
    assert ("sender-299", 1) in book._missing_tries  # the one tried longest ago went first
    assert book.refusals() == []  # given up before their last try: no strike (see the test above)


def _asked_then_pushed_out(book: SenderBook, sender: str, rounds: int, served_every: int = 0) -> list[str]:
    """``rounds`` times: ``sender`` announces 16 fresh records, the reader asks for the newest once and gets it
    (every ``served_every``-th round; 0: never) or an answer without it, and the next announcement pushes it out.
    The strikes handed to the node meanwhile."""
    seq, now, strikes = 0, book._clock.time(), []
    for round_ in range(rounds):
        _announce(book, sender, now, *((seq := seq + 1, now) for _ in range(16)))
        asked = RecordRef(seq, now, 1)
        if served_every and round_ % served_every == 0:
            book.mark_fetched(sender, asked, f"host-of-{sender}")
        else:
            book.record_missing(sender, asked)  # its host answered without it
        strikes += [reason for who, reason in book.refusals() if who == sender]
    _announce(book, sender, now, *((seq := seq + 1, now) for _ in range(16)))  # the last one asked pushed out too
    return strikes + [reason for who, reason in book.refusals() if who == sender]


def test_a_sender_announcing_more_than_it_serves_is_struck_though_each_record_goes_before_its_last_try():
    """Each record asked once, answered without, pushed out by newer ones before a second try: no strike came of it
    (the rule spares an honest publisher too fast for this reader), so a sender announcing what it never serves
    took its share of every refill for good. Once it served none of 4 records asked, each one more is a strike."""
    book = SenderBook(DHTTransportConfig(), SwarmCounters(), ManualClock())
    strikes = _asked_then_pushed_out(book, "unserving", rounds=8)
    assert strikes == ["never_served"] * 5  # the 4th record asked, then each one after
    assert book._senders["unserving"].rest_until > book._clock.monotonic()  # resting: not chosen meanwhile


def test_a_fast_honest_publisher_that_serves_some_of_what_it_is_asked_is_never_struck():
    """An honest publisher whose older records are pushed out before this reader asks still serves some of the fresh
    ones asked: a quarter served, the rest pushed out unserved, over 40 records asked, strikes nothing."""
    book = SenderBook(DHTTransportConfig(), SwarmCounters(), ManualClock())
    assert _asked_then_pushed_out(book, "fast", rounds=40, served_every=4) == []


def test_identities_naming_another_peers_host_never_make_this_reader_ask_it_past_half_its_budget():
    """Index entries name their host unchecked: 128 identities naming an honest publisher's host, each listing 8
    records, made a reader ask that host for all of them; the host rested the reader past its serve budget and answered
    it empty, the honest publisher's own records too. Now at most `HOST_REQUESTS` (half the host's budget) a window."""
    from swarm.records import IndexEntry
    from swarm.serve_gate import SERVE_BUDGET_REQUESTS, SERVE_WINDOW_SECONDS

    clock = ManualClock()
    book = SenderBook(DHTTransportConfig(max_unknown_senders=1000), SwarmCounters(), clock)
    now = clock.time()
    for n in range(128):
        refs = [RecordRef(seq, now, 1) for seq in range(8)]
        book.take_index_entry(f"sybil-{n}", b"key-%d" % n, IndexEntry("m", refs, now, host="honest-host"))
    asked: list[float] = []
    for _ in range(40):  # 20 s of refills every half second, each fetch answered without its record
        chosen, _ = book.choose(need=64)
        for choice in chosen:
            book.fetching(choice, True)
            asked.append(clock.monotonic())
            book.fetching(choice, False)
            book.record_missing(choice.sender, choice.ref)
        clock.advance(0.5)
    busiest = max(sum(1 for t in asked if start <= t < start + SERVE_WINDOW_SECONDS) for start in asked)
    assert 0 < busiest <= SERVE_BUDGET_REQUESTS // 2, f"{busiest} requests to the host within one window"
