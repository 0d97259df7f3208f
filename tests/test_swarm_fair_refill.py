"""An open swarm's bounds on what one cheap peer can make a reader spend, on real DHT peers (p2pd with GossipSub) on
loopback: a claim covers at most its sender's share of a refill, refused and unserved records rest their sender and
reach the node's standing, the book of unknown identities stays bounded, and a heard record is fetched while its
publisher still serves it. The rules themselves are also checked on the reader's book alone, on an injected clock."""

# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from hivemind.utils.crypto import RSAPrivateKey

from swarm.announcement_gate import MIN_REFUSED
from swarm.announcements import AnnouncedRecord, Announcement
from swarm.clock import ManualClock
from swarm.config import DHTTransportConfig
from swarm.records import IndexEntry, RecordRef
from swarm.senders import SenderBook
from swarm.transport import SwarmCounters
from testbed.hostile_peer import announce_identities, publish_unchecked, unchecked_record
from tests.swarm_fixtures import dht_peers, make_group, no_p2pd_left_behind, wait_until  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")

QUIET_INDEX = dict(index_refresh_interval=600.0)  # after its first read, a peer reads the index only if starving


def _hears(reader, *others) -> None:
    wanted = {other.peer_id for other in others}
    wait_until(lambda: wanted <= {p.peer for p in reader.peers()}, 30, message="(the peers never heard of each other)")
    wait_until(lambda: reader.readout().counters.get("announcements_received", 0) >= 2, 30)


def _ids(items) -> list[str]:
    return [item.group.group_id for item in items]


# ------------------------------------------------------------------------------------------------ real peers


def test_an_inflated_claim_dated_ahead_does_not_take_the_refill_from_an_honest_publisher(dht_peers):
    """An attacker publishes, 10 times a second, records dated 2 s ahead that claim 8 groups and hold one, faster than
    the victim refills (about twice a second here): before the fair refill, each refill took the attacker's freshest
    record alone (its date beats every honest one, its claim covers the need), and the honest publisher's records
    were not fetched while the flood lasted."""
    # the victim reads the index every second too, and the honest peer waits longer on its announcements: a loaded
    # machine may lose one, and the test is of the refill, not of announcements
    victim = dht_peers(prefetch_groups=4, poll_interval=1.0)
    honest = dht_peers(initial_peers=victim.visible_addresses(), wait_timeout=5.0, **QUIET_INDEX)
    attacker = dht_peers(initial_peers=victim.visible_addresses(), **QUIET_INDEX)
    _hears(victim, honest, attacker)
    stop = threading.Event()

    def flood() -> None:
        n = 0
        while not stop.is_set():
            ahead = time.time() + 2.0
            record = unchecked_record([make_group(f"inflated-{n}", created_at=ahead)], created_at=ahead)
            publish_unchecked(attacker, record, num_groups=8, created_at=ahead)
            n += 1
            time.sleep(0.1)

    flooding = threading.Thread(target=flood, daemon=True)
    flooding.start()
    got: list = []
    try:
        time.sleep(1.0)  # the flood is on before the honest records come
        published = [f"honest-{n}" for n in range(6)]
        for group_id in published:
            honest.publish([make_group(group_id)])
            time.sleep(0.3)
        # the caller takes 4 groups at a time; every honest group arrives while the flood goes on
        wait_until(lambda: got.extend(victim.fetch(4)) or set(published) <= set(_ids(got)), 30, interval=0.5,
                   message=f"(taken: {sorted(g for g in _ids(got) if g.startswith('honest'))}, "
                           f"{victim.readout().counters})")  # fmt: skip
        assert flooding.is_alive()
    finally:
        stop.set()
        flooding.join(10)
    counters = victim.readout().counters
    assert counters["rejected/claim_mismatch"] >= 1  # a record that breaks its claim is refused...
    assert victim.reader.book.standing(attacker.peer_id) == "bad"  # ...and counts against its sender
    assert "claim_mismatch" in {reason for sender, reason in victim.refusals() if sender == attacker.peer_id}
    assert victim.reader.book.standing(honest.peer_id) == "unjudged"  # no strike against the honest publisher


def test_refused_and_unserved_records_rest_their_publisher_and_reach_the_nodes_sender_standing(
    tmp_path, smollm_tokenizer, dht_peers
):
    """A liar publishes records the transport refuses (empty completions); a ghost announces records and then never
    serves them. Each refusal rests its sender in the transport, and the node's intake counts it against the sender:
    both are benched by the node's standing without one of their groups reaching it."""
    from sapo.tasks import build_reasoning_gym_dataset
    from testbed.hostile_peer import TASKS
    from testbed.tiny_run import tiny_trainer

    victim = dht_peers(**QUIET_INDEX)
    liar = dht_peers(initial_peers=victim.visible_addresses(), **QUIET_INDEX)
    ghost = dht_peers(initial_peers=victim.visible_addresses(), **QUIET_INDEX)
    _hears(victim, liar, ghost)
    ghost.served.get = lambda key: None  # announces each record, then answers every request without it
    for n in range(3):  # one at a time: an announcement lists the newest two records
        publish_unchecked(liar, unchecked_record([dataclasses.replace(make_group(f"empty-{n}"), completions=[""] * 4)]))
        ghost.publish([make_group(f"ghost-{n}")])
        for peer in (liar, ghost):
            wait_until(lambda peer=peer, n=n: peer.readout().counters.get("published_records", 0) == n + 1, 20)
    book = victim.reader.book
    # three strikes: the liar stands badly and rests (4 s after its third)
    wait_until(lambda: victim.readout().counters.get("rejected/empty_group", 0) == 3, 30)
    assert book.standing(liar.peer_id) == "bad" and book.resting(liar.peer_id)
    # each ghost record is asked for a few times, then given up as never served
    wait_until(lambda: victim.readout().counters.get("records_missing", 0) == 3, 30, message=str(victim.readout()))
    assert book.standing(ghost.peer_id) == "bad"
    counters = victim.readout().counters
    assert counters["sender_strikes"] == 6 and counters["heard_never_fetched"] == 3  # the ghost's three

    def no_reward(prompts, completions, **columns):
        return [0.0] * len(completions)

    rows = build_reasoning_gym_dataset(TASKS, size=8, seed=5)
    trainer = tiny_trainer(
        tmp_path / "node", smollm_tokenizer, [no_reward], rows, victim,
        num_local=1, num_external=1, max_steps=1, plausibility_margin=None, sender_drop_limit=3, sender_window=5,
    )  # fmt: skip
    trainer.train()
    standing, now = trainer.intake.standing, time.time()
    assert standing.is_benched(liar.peer_id, now) and standing.is_benched(ghost.peer_id, now)
    assert trainer.sender_outcomes[liar.peer_id]["refused/empty_group"] == 3
    assert trainer.sender_outcomes[ghost.peer_id]["refused/never_served"] == 3
    assert trainer.swarm_totals["transport_refusals"] == 6 and trainer.swarm_totals["benched_senders"] == 2
    assert liar.peer_id not in trainer.taken_from and ghost.peer_id not in trainer.taken_from


def test_one_host_announcing_many_identities_is_capped_and_the_book_of_unknown_ones_stays_bounded(dht_peers):
    """A real peer announces "still here" under 24 fresh keys. A reader with the default cap takes 4 identities from
    one libp2p host; one without the cap keeps at most max_unknown_senders identities not judged good, forgetting the
    least useful first, and keeps the honest publisher its node judged good (whose records it still fetches)."""
    capped = dht_peers(**QUIET_INDEX)
    bounded = dht_peers(initial_peers=capped.visible_addresses(), max_senders_per_host=0, max_unknown_senders=8,
                        **QUIET_INDEX)  # fmt: skip
    honest = dht_peers(initial_peers=capped.visible_addresses(), **QUIET_INDEX)
    sybil = dht_peers(initial_peers=capped.visible_addresses(), **QUIET_INDEX)
    for reader in (capped, bounded):
        _hears(reader, honest, sybil)
    bounded.judge(honest.peer_id, True)  # the node trained on one of its groups
    keys = [RSAPrivateKey() for _ in range(24)]
    assert announce_identities(sybil, keys) == 24

    # the capped reader: the sybil host's own identity and 3 more, the other 21 refused: the first few checked, then,
    # refused more often than not, the host rests and the rest are dropped unread (swarm.announcement_gate)
    refused = lambda counters: sum(counters.get(f"rejected/{r}", 0) for r in ("too_many_identities", "announce_rested"))  # noqa: E731
    wait_until(lambda: refused(capped.readout().counters) >= 21, 30, message=str(capped.readout().counters))
    counters = capped.readout().counters
    assert MIN_REFUSED <= counters["rejected/too_many_identities"] <= 21
    assert counters["announce_publishers_rested"] == 1
    assert capped.readout().gauges["known_senders"] == 3 + 3  # honest, bounded, the sybil and 3 of its keys
    # the bounded reader: 26 identities not judged good (capped, the sybil's own and its 24 keys) for 8 places; the
    # honest peers among them announce every 2 s and may come back, each evicting another
    wait_until(lambda: bounded.readout().counters.get("evicted_senders", 0) >= 26 - 8, 30,
               message=str(bounded.readout().counters))  # fmt: skip
    gauges = bounded.readout().gauges
    assert gauges["unknown_senders"] == 8 and gauges["good_senders"] == 1
    assert honest.peer_id in bounded.reader.book.senders()
    honest.publish([make_group("after-the-flood")])
    got: list = []
    wait_until(lambda: got.extend(bounded.fetch(4)) or "after-the-flood" in _ids(got), 20)


def test_a_loaded_reader_fetches_a_record_served_for_ten_seconds_and_counts_one_it_never_could(dht_peers):
    """The reader's caller takes 4 groups every 14 s (a slow step): the refill just before its next take comes after
    a publisher that served its record for 10 s left. The record, heard and waiting, is fetched while it is served; one
    whose publisher left after 1 s is lost, and counted as heard and never fetched."""
    step = 14.0
    reader = dht_peers(fetch_heard_within=3.0, **QUIET_INDEX)
    publisher = dht_peers(initial_peers=reader.visible_addresses(), **QUIET_INDEX)
    brief = dht_peers(initial_peers=reader.visible_addresses(), **QUIET_INDEX)
    _hears(reader, publisher, brief)
    assert reader.fetch(4) == []
    time.sleep(step)
    assert reader.fetch(4) == []  # the reader knows its caller's pace now: 4 groups every 14 s
    last_take = time.monotonic()
    publisher.publish([make_group("served-for-10-s")])
    brief.publish([make_group("served-for-1-s")])
    time.sleep(1.0)
    brief.close()
    time.sleep(9.0)
    publisher.close()
    time.sleep(max(0.0, last_take + step - time.monotonic()))
    assert _ids(reader.fetch(4)) == ["served-for-10-s"]  # none lost of a publisher that served while it was waited on
    wait_until(lambda: reader.readout().counters.get("heard_never_fetched", 0) == 1, 30)
    assert reader.readout().counters["heard_never_fetched"] == 1


# ------------------------------------------------------------------------------------------------ the book's rules


def _announce(
    book: SenderBook, sender: str, now: float, *records: tuple[int, float, int], host: str = "", size: int = 100
) -> None:
    """``sender`` announces records ``(seq, created_at, num_groups)`` of ``size`` bytes each, served from ``host``
    (default: its own)."""
    host = host or f"host-of-{sender}"
    announced = tuple(AnnouncedRecord(seq, at, groups, size, b"d" * 32) for seq, at, groups in records)
    book.take_announcement(Announcement(sender, b"key-" + sender.encode(), "m", now, host, announced), origin=host)


def test_a_claim_covers_at_most_its_senders_share_and_a_date_ahead_buys_no_precedence():
    clock = ManualClock()
    book, now = SenderBook(DHTTransportConfig(), SwarmCounters(), clock), clock.time()
    _announce(book, "inflated", now, (1, now + 2.0, 8))  # 2 s ahead, claims 8 groups
    _announce(book, "honest", now, (1, now - 1.0, 1))
    chosen, _ = book.choose(4)
    assert {choice.sender for choice in chosen} == {"inflated", "honest"}  # the claim covered half the refill
    # judged good, a sender's records are round-robin with the others', freshest first, beyond its share if needed
    book.judge("honest", True)
    _announce(book, "honest", now, (2, now - 0.5, 1), (3, now - 0.2, 1))
    assert [(c.sender, c.ref.seq) for c in book.choose(4)[0]] == [("inflated", 1), ("honest", 3), ("honest", 2),
                                                                  ("honest", 1)]  # fmt: skip


def test_a_take_hands_out_fresh_groups_before_leftovers_yet_a_stale_sender_keeps_its_share():
    from swarm.refill import Offer, fair_take

    def groups(sender: str, dates: list[float], stale: bool, trusted: bool = False) -> list[Offer]:
        return [Offer(f"{sender}{n}", sender, 1, date, False, trusted, stale=stale) for n, date in enumerate(dates)]

    # two senders with fresh groups, two with leftovers from steps ago: the take is the fresh ones' (a round-robin
    # over all of them handed out both leftovers, each its sender's freshest, before either fresh sender's second)
    offers = {
        "a": groups("a", [100.0, 99.0, 98.0], stale=False),
        "b": groups("b", [100.5, 99.5], stale=False),
        "c": groups("c", [80.0], stale=True),
        "d": groups("d", [75.0], stale=True),
    }
    assert [o.item for o in fair_take(offers, 4, 0.5, 0.25)] == ["b0", "a0", "b1", "a1"]
    # a leftover fills what the fresh groups leave
    assert [o.item for o in fair_take(offers, 6, 0.5, 0.25)] == ["b0", "a0", "b1", "a1", "a2", "c0"]
    # one sender's many fresh groups take no more than its share while a stale sender's groups wait
    flood = {"x": groups("x", [100.0 - n / 10 for n in range(64)], stale=False), "c": groups("c", [80.0, 79.0], True)}
    assert sorted(o.item for o in fair_take(flood, 4, 0.5, 0.25)) == ["c0", "c1", "x0", "x1"]
    # a sender judged good keeps its share of a take over strangers' fresh groups, its own groups stale or not
    trusted = {"g": groups("g", [80.0, 79.0], stale=True, trusted=True), "x": flood["x"]}
    assert sorted(o.item for o in fair_take(trusted, 4, 0.5, 0.25)) == ["g0", "g1", "x0", "x1"]


def test_a_senders_large_records_cover_its_share_sooner_so_its_bytes_in_a_refill_stay_bounded():
    """Both senders judged good: before bytes counted, the sender of 3 MiB records of one group had 8 of them fetched
    in a refill of 16 groups (24 MiB: its share, counted in groups), and all 16 with no one else offering."""
    clock = ManualClock()
    book, now = SenderBook(DHTTransportConfig(), SwarmCounters(), clock), clock.time()
    for sender, size in (("large", 3 * 2**20), ("honest", 8_500)):
        _announce(book, sender, now, *((seq, now - seq * 0.01, 1) for seq in range(1, 17)), size=size)
        book.judge(sender, True)
    chosen = book.choose(16)[0]
    assert sum(c.sender == "large" for c in chosen) == 1  # 12 groups' worth of bytes: its share of 8 at once
    assert sum(c.sender == "honest" for c in chosen) == 8
    # offering alone, it is still read, beyond its share: one more record covers the rest of the refill
    book.judge("honest", False), book.judge("honest", False), book.bench("honest", 60.0)
    assert [c.sender for c in book.choose(16)[0]] == ["large", "large"]
    # only bytes over refill_group_bytes count: records of 256 KiB count for their one group each, as before
    book = SenderBook(DHTTransportConfig(), SwarmCounters(), clock)
    _announce(book, "long", now, *((seq, now, 1) for seq in range(1, 17)), size=256 * 2**10)
    book.judge("long", True)
    assert len(book.choose(16)[0]) == 16


def test_a_record_never_announced_counts_for_the_bytes_its_senders_records_took():
    clock = ManualClock()
    book, now = SenderBook(DHTTransportConfig(), SwarmCounters(), clock), clock.time()
    _index_entry(book, "index-only", now, *((seq, now, 1) for seq in range(1, 9)))
    first = book.choose(8)[0]
    assert len(first) == 8  # alone, its share of 8 and the rest: its records' sizes are not known yet
    book.fetched_size("index-only", first[0].ref, 3 * 2**20)  # one arrived: 3 MiB for its one group
    book.mark_fetched("index-only", first[0].ref)
    assert len(book.choose(8)[0]) == 2  # the rest count as 12 groups each: one for its share, one beyond it


def test_a_spare_fits_what_is_left_of_its_senders_share_and_a_choice_keeps_what_was_announced():
    clock = ManualClock()
    book, now = SenderBook(DHTTransportConfig(), SwarmCounters(), clock), clock.time()
    _announce(book, "honest", now, (1, now, 1))
    book.judge("honest", True)
    _announce(book, "small", now, (1, now, 1))  # the freshest stranger's record: the pool's one group
    _announce(book, "large", now, (1, now - 1, 1), size=3 * 2**20)  # 12 groups' worth: more than a stranger's share
    _announce(book, "tiny", now, (1, now - 2, 1))
    chosen, spares = book.choose(4, spares=2)
    assert sorted(c.sender for c in chosen) == ["honest", "small"]
    assert [c.sender for c in spares] == ["tiny"]  # a hedge of a slow record never fetches 3 MiB
    # the digest and size announced travel with the choice: newer records pushing it out of the book while it is
    # fetched (the check was then skipped) leave them to check
    _announce(book, "honest", now, *((seq, now, 1) for seq in range(2, 40)))
    assert chosen[0].announced == (b"d" * 32, 100)
    assert 1 not in {c.ref.seq for c in book.choose(64, since_take=False)[0] if c.sender == "honest"}


def _fetched(book: SenderBook, choices, size: int | None = None) -> None:
    """Fetch ``choices`` as the fetcher does, each answered with its record (``size`` bytes; default as announced)."""
    for choice in choices:
        book.fetching(choice, True)
    for choice in choices:
        book.mark_fetched(choice.sender, choice.ref, choice.host)
        book.fetched_size(choice.sender, choice.ref, size or choice.announced[1])
        book.fetching(choice, False)


def test_what_a_sender_spent_lasts_until_the_take_and_a_strangers_large_record_never_costs_the_good_their_take():
    clock = ManualClock()
    book, now = SenderBook(DHTTransportConfig(), SwarmCounters(), clock), clock.time()
    _announce(book, "good", now, (1, now, 1))
    book.judge("good", True)
    _announce(book, "stranger", now, (1, now, 1), size=3 * 2**20)  # 12 groups' worth, of which the pool counts 2
    book.new_take()
    taken = 0
    for poll in range(8):  # the good sender publishes two records between two polls of one take
        _announce(book, "good", now, (2 + 2 * poll, now, 1), (3 + 2 * poll, now, 1))
        chosen = book.choose(16)[0]
        taken += sum(choice.sender == "good" for choice in chosen)
        _fetched(book, chosen)
    assert taken == 14  # 16 less the pool's 2: its share, then beyond it (a stranger's 12 cost it 8 of them)
    assert book.covered(16) == 8 + 2
    # the take resets the shares; a fetch whose host answered without the record spent nothing, one that got no
    # answer in time may have carried bytes and spent its share
    book.new_take()
    _announce(book, "stranger", now, (2, now, 1), (3, now, 1))
    first, second = (c for c in book.choose(16)[0] if c.sender == "stranger")
    book.fetching(first, True), book.record_missing("stranger", first.ref), book.fetching(first, False)
    assert book.covered(16) == 0
    book.fetching(second, True), book.record_missing("stranger", second.ref, unreachable=True)
    book.fetching(second, False)
    assert book.covered(16) == 1
    # a record announced larger than it is counts for what arrived
    book.new_take()
    _announce(book, "other", now, (1, now, 1), size=3 * 2**20)
    _fetched(book, [c for c in book.choose(16)[0] if c.sender == "other"], size=100)
    assert book.covered(16) == 1


def test_senders_not_judged_good_share_a_pool_while_one_judged_good_offers_records():
    clock = ManualClock()
    book, now = SenderBook(DHTTransportConfig(), SwarmCounters(), clock), clock.time()
    for n in range(10):
        _announce(book, f"stranger-{n}", now, (1, now, 4))
    assert len(book.choose(16)[0]) == 4  # no one judged good: every sender's share, no pool
    _announce(book, "honest", now - 5, (1, now - 5, 4), (2, now - 4, 4))
    book.judge("honest", True)
    chosen = book.choose(16)[0]  # the pool: a quarter of 16 groups, half of it a sender: two strangers' records of 4
    assert sum(choice.sender.startswith("stranger") for choice in chosen) == 2
    assert sorted(choice.ref.seq for choice in chosen if choice.sender == "honest") == [1, 2]


def test_three_thousand_fresh_identities_leave_the_book_bounded_and_keep_the_senders_judged_good():
    clock, counters = ManualClock(), SwarmCounters()
    book = SenderBook(DHTTransportConfig(), counters, clock)  # max_unknown_senders: 256
    _announce(book, "honest", clock.time(), (1, clock.time(), 4))
    book.judge("honest", True)
    for n in range(3000):  # one host each: the cap per host does not help here
        clock.advance(0.01)
        _announce(book, f"sybil-{n}", clock.time(), (1, clock.time(), 8))
        if n % 50 == 0:  # a newcomer that keeps announcing, as an honest peer does
            _announce(book, "newcomer", clock.time())
    senders = book.senders()
    assert len(senders) == 1 + 256 and "honest" in senders and "newcomer" in senders
    assert counters.snapshot()["evicted_senders"] == 3001 - 256
    assert book.gauges()["unknown_senders"] == 256


def _index_entry(book: SenderBook, sender: str, now: float, *records: tuple[int, float, int]) -> None:
    """``sender`` lists records ``(seq, created_at, num_groups)`` in an index entry dated ``now`` (no libp2p host
    vouches for it: anyone may write one under a fresh key)."""
    refs = [RecordRef(seq, at, groups) for seq, at, groups in records]
    entry = IndexEntry(model="m", records=refs, updated_at=now, host=f"host-of-{sender}")
    book.take_index_entry(sender, b"key-" + sender.encode(), entry)


def test_a_stream_of_index_only_identities_larger_than_the_book_never_forgets_an_announced_newcomer():
    # Fresh keys writing index entries, each dated now, are each heard more recently than an honest newcomer
    # announced once: they used to evict it (the one heard from longest ago) before its record was fetched.
    clock, counters = ManualClock(), SwarmCounters()
    book = SenderBook(DHTTransportConfig(), counters, clock)  # 256 places, 128 of them for index-only senders
    _announce(book, "newcomer", clock.time(), (1, clock.time(), 4))
    for n in range(3 * 256):
        clock.advance(0.01)
        _index_entry(book, f"ghost-{n}", clock.time(), (1, clock.time(), 8))
    assert book.standing("newcomer") == "unjudged"  # still in the book, its record still to fetch
    # the index-only senders use the places the announced leave free, and evict among themselves beyond the book
    assert book.gauges()["unknown_senders"] == 256
    assert counters.snapshot()["evicted_senders"] == 3 * 256 - 255
    chosen = [choice for choice in book.choose(10_000)[0] if choice.sender == "newcomer"]
    assert [choice.ref.seq for choice in chosen] == [1]


def test_a_sender_first_found_in_the_index_is_announced_once_its_host_announces_it():
    clock = ManualClock()
    book = SenderBook(DHTTransportConfig(max_unknown_senders=8), SwarmCounters(), clock)
    _index_entry(book, "joiner", clock.time(), (1, clock.time(), 1))  # a reader's first index read finds it
    clock.advance(1.0)
    _announce(book, "joiner", clock.time(), (2, clock.time(), 1))  # then its announcement arrives
    for n in range(40):
        clock.advance(0.01)
        _index_entry(book, f"ghost-{n}", clock.time(), (1, clock.time(), 1))
    assert book.standing("joiner") == "unjudged"


def test_announced_identities_leave_index_only_senders_their_part_of_the_book():
    # An honest peer this reader knows from the index alone (it announces on topics this reader does not listen to)
    # keeps a fair chance: a stream of announced identities (a libp2p host each) evicts only beyond its own part.
    clock, counters = ManualClock(), SwarmCounters()
    book = SenderBook(DHTTransportConfig(max_unknown_senders=8), counters, clock)  # 4 places each, borrowed if free
    for n in range(6):
        clock.advance(0.01)
        _index_entry(book, f"quiet-{n}", clock.time(), (1, clock.time(), 1))
    for n in range(100):
        clock.advance(0.01)
        _announce(book, f"sybil-{n}", clock.time(), (1, clock.time(), 8))
    # the two that had borrowed announced places went first, then the announced evicted among themselves
    assert [sender for sender in book.senders() if sender.startswith("quiet")] == [f"quiet-{n}" for n in (2, 3, 4, 5)]
    assert book.gauges()["unknown_senders"] == 8 and counters.snapshot()["evicted_senders"] == 106 - 8


def test_a_host_judged_good_is_retried_soon_after_a_failure_and_a_stranger_after_30_s():
    clock = ManualClock()
    book, now = SenderBook(DHTTransportConfig(), SwarmCounters(), clock), clock.time()
    _announce(book, "honest", now, (1, now, 1))
    _announce(book, "stranger", now, (1, now, 1))
    book.judge("honest", True)
    book.rest("host-of-honest", "honest")
    book.rest("host-of-stranger", "stranger")
    clock.advance(1.5)
    assert [choice.sender for choice in book.choose(4)[0]] == ["honest"]
    book.rest("host-of-honest", "honest")  # failed again: 2 s
    clock.advance(1.5)
    assert book.choose(4)[0] == []
    clock.advance(29)
    assert {choice.sender for choice in book.choose(4)[0]} == {"honest", "stranger"}


def test_a_record_waiting_longer_than_fetch_heard_within_is_fetched_before_the_refill_is_due():
    clock = ManualClock()
    book, now = SenderBook(DHTTransportConfig(fetch_heard_within=10.0), SwarmCounters(), clock), clock.time()
    _announce(book, "early", now, (1, now, 1))
    clock.advance(8)
    _announce(book, "late", clock.time(), (1, clock.time(), 1))
    assert book.choose(4, urgent_only=True)[0] == []
    clock.advance(3)  # the early record waited 11 s, the late one 3 s
    assert [choice.sender for choice in book.choose(4, urgent_only=True)[0]] == ["early"]


def _refills(book: SenderBook, clock: ManualClock, refills: int, claimers: int) -> list[list[tuple[str, int]]]:
    """``refills`` refills for 16 groups, 3 s apart, one every step: a sender judged good and an honest newcomer each
    announce a record of 4 groups dated half a second ago, and each of ``claimers`` identities one of 8 groups dated
    now, just before the refill; every record chosen is fetched. The chosen ``(sender, seq)`` of each refill."""
    plans = []
    for step in range(refills):
        now = clock.time()
        _announce(book, "good", now, (step + 2, now - 0.5, 4))
        _announce(book, "newcomer", now, (step + 2, now - 0.5, 4))
        for n in range(claimers):
            _announce(book, f"claimer-{n}", now, (step + 1, now, 8))
        chosen = book.choose(16)[0]
        for choice in chosen:
            book.mark_fetched(choice.sender, choice.ref, choice.host)
        plans.append([(choice.sender, choice.ref.seq) for choice in chosen])
        clock.advance(3.0)
    return plans


def _book_with_a_good_sender_and_a_newcomer(step: float | None = None) -> tuple[SenderBook, ManualClock]:
    """A book whose caller's step is ``step`` seconds (``None``: not known yet, every record fresh)."""
    clock = ManualClock()
    book = SenderBook(DHTTransportConfig(), SwarmCounters(), clock, fresh_within=lambda: step)
    now = clock.time()
    _announce(book, "good", now, (1, now, 4))
    book.judge("good", True)
    _announce(book, "newcomer", now, (1, now, 4))
    return book, clock


def test_a_fresh_claim_before_every_refill_covers_only_its_share_of_the_pool_and_the_newcomer_is_fetched():
    # One identity announcing a true record of 8 groups dated now before each refill used to be credited with its
    # share of the whole need (8 of 16) inside a pool of 4: its record alone covered the pool at every refill, and an
    # honest newcomer's record, always older, was never fetched (nor judged, nor could it earn a share of its own).
    book, clock = _book_with_a_good_sender_and_a_newcomer()
    plans = _refills(book, clock, 5, claimers=1)
    for step, plan in enumerate(plans):  # the pool is 4 groups: the claimer's record (credited 2, half the pool)...
        assert [seq for sender, seq in plan if sender == "claimer-0"] == [step + 1]
        assert sum(sender == "newcomer" for sender, _ in plan) == 1  # ...and the newcomer's
    assert all(("good", step + 2) in plan for step, plan in enumerate(plans))  # the good sender keeps its share


def test_senders_take_turns_in_the_pool_so_fresh_claimers_cannot_keep_a_newcomer_out():
    # Two identities with fresh claims fill the pool (half of it each) at every refill if the freshest go first; by
    # turns, the newcomer, fetched longest ago, goes first at the next refill.
    book, clock = _book_with_a_good_sender_and_a_newcomer()
    plans = _refills(book, clock, 6, claimers=2)
    fetched = [step for step, plan in enumerate(plans) if any(sender == "newcomer" for sender, _ in plan)]
    assert fetched and fetched[0] <= 1 and len(fetched) >= 3
    for plan in plans:  # each claimer within half the pool: one record a refill at most
        assert all(sum(sender == f"claimer-{n}" for sender, _ in plan) <= 1 for n in range(2))


def test_a_sender_the_node_benched_takes_no_room_of_a_refill_for_the_benchs_length():
    clock = ManualClock()
    book, now = SenderBook(DHTTransportConfig(max_unknown_senders=2), SwarmCounters(), clock), clock.time()
    _announce(book, "good", now, (1, now - 5, 4))
    book.judge("good", True)
    _announce(book, "cheat", now, (1, now, 8))  # fresh, claims 8
    _announce(book, "newcomer", now - 1, (1, now - 1, 4))
    book.bench("cheat", 600.0)  # the node set its groups aside: it will read none for 10 minutes
    assert book.resting("cheat")
    assert {choice.sender for choice in book.choose(16)[0]} == {"good", "newcomer"}
    # forgotten (the book of unknown senders is full) and heard of again, it is still benched
    for n in range(3):
        _announce(book, f"stranger-{n}", now, (1, now - 2, 1))
    assert "cheat" not in book.senders()
    clock.advance(1.0)
    _announce(book, "cheat", clock.time(), (2, clock.time(), 8))
    assert "cheat" in book.senders() and "cheat" not in {choice.sender for choice in book.choose(16)[0]}
    clock.advance(600.0)
    _announce(book, "cheat", clock.time(), (3, clock.time(), 8))
    assert not book.resting("cheat") and "cheat" in {choice.sender for choice in book.choose(16)[0]}


@pytest.mark.parametrize("step", [None, 3.0])
def test_fresh_identities_before_every_refill_queue_behind_a_newcomer_heard_before_them(step):
    # Two new identities before each refill, each with a record dated now (a fresher date than the newcomer's): as
    # senders never fetched from they used to go before the newcomer once it had been fetched, so after its first
    # fetch the pool was theirs at every refill (1 fetch in 16 refills). Queued by how long each waited (a sender
    # never fetched from since the reader first heard of it, counted in fetches begun), those heard after its fetch
    # wait behind it: it is fetched at the first or second refill (heard with the first two, its record as fresh as
    # theirs), and again each time those heard before its last fetch have had their turn; the identities arriving
    # faster than the pool takes them, those turns come ever less often (its groups judged good, it takes a share of
    # its own).
    # (with the caller's step known, every record here is fresh: made within the step)
    book, clock = _book_with_a_good_sender_and_a_newcomer(step)
    plans = []
    for refill in range(16):
        now = clock.time()
        _announce(book, "good", now, (refill + 2, now - 0.5, 4))
        _announce(book, "newcomer", now, (refill + 2, now - 0.5, 4))
        for n in range(2):
            _announce(book, f"fresh-{refill}-{n}", now, (1, now, 8))
        chosen = book.choose(16)[0]
        for choice in chosen:
            book.mark_fetched(choice.sender, choice.ref, choice.host)
        plans.append([choice.sender for choice in chosen])
        clock.advance(3.0)
    fetched = [refill for refill, plan in enumerate(plans) if "newcomer" in plan]
    assert fetched[0] <= 1 and len(fetched) >= 6, fetched
    assert all("good" in plan for plan in plans)  # the good sender keeps its share
    assert all(sum(sender.startswith("fresh") for sender in plan) <= 2 for plan in plans)  # the pool: half each


def test_a_slow_publishers_record_is_fetched_in_turn_beside_a_fast_one_that_publishes_before_every_refill():
    # A reader stepping every 0.5 s; a fast publisher judged good with a fresh record before each refill, a slow one
    # (a larger model) with one record every 5 s. Records older than the reader's step alone went after every fresh one,
    # and the fast publisher's, covering the need of one group, kept the slow one out; within fetch_heard_within the
    # slow record counts as fresh and takes its turn.
    from swarm.refill import fresh_window

    config, clock = DHTTransportConfig(), ManualClock()
    book = SenderBook(config, SwarmCounters(), clock, fresh_within=lambda: fresh_window(0.5, config.fetch_heard_within))
    for sender in ("fast", "slow"):
        _announce(book, sender, clock.time(), (1, clock.time(), 1))
        book.judge(sender, True)
    fetched = []
    for refill in range(20):
        now = clock.time()
        _announce(book, "fast", now, (refill + 2, now, 1))
        if refill % 10 == 0:
            _announce(book, "slow", now, (refill + 2, now, 1))
        clock.advance(0.5)
        for choice in book.choose(1)[0]:
            book.mark_fetched(choice.sender, choice.ref, choice.host)
            fetched.append(choice.sender)
    assert fetched.count("slow") >= 2, fetched  # each of its records in its turn
    assert fetched.count("fast") >= 10, fetched
    assert fresh_window(None, 10.0) is None and fresh_window(30.0, 10.0) == 30.0
