"""A fair refill: which of the records heard to fetch for a number of groups, so that what a sender claims never
takes more than its share.

A refill wants ``need`` groups. Records are offered by their senders with a claimed group count and a date; both are
the sender's word, and a sender may lie in either (a record dated ahead of this peer's clock, a record claiming 64
groups that holds one). So:

- **Every sender's share is bounded.** A record is credited towards the need with its claimed group count, but one
  sender's records are credited with at most ``refill_sender_share`` of the need in all (at least one group): a
  claim of many groups cannot cover the refill, the next sender's record is fetched too. A claim the record then
  breaks is refused (``rejected/claim_mismatch``) and counts against its sender.
- **Senders not judged good share a small pool.** A sender earns a share of its own once the node judged its groups
  good (:meth:`swarm.senders.SenderBook.judge`); while a sender judged good offers a record, all the others together
  are credited with at most ``refill_unjudged_share`` of the need (at least one group, never all of it), so that a
  thousand fresh identities take no more of a refill than one. Within the pool each sender is credited with at most
  ``refill_sender_share`` of the *pool* (at least one group), so one claim never covers it. The pool is reserved: a
  newcomer is fetched, judged, and can earn its share even when the senders judged good publish more than this peer
  takes. With no sender judged good yet (a node that has not judged, a transport used alone) there is no one to
  protect and the pool is the whole need.
- **Fresh records, then turns.** Each sender offers its records in turn, one per round (its freshest, then its
  next); within a round the records made since the caller's last step (or within ``fetch_heard_within``, if longer:
  :func:`fresh_window`) come first (a reader wants the freshest groups),
  then the others, and within each the sender that waited longest goes first (its ``turn``: since its last fetch, or,
  never fetched from, since the reader first heard of it, counted in the reader's fetches), the freshest record
  breaking ties. A sender that publishes a fresh record before every refill is fetched from, then waits behind the
  senders that waited longer, and an identity made before every refill waits behind a newcomer fetched before it was
  heard of: neither keeps a newcomer with a fresh record out of the pool. A record's date counts at most as this peer's
  now, so dating a record ahead (within the clock tolerance) buys no precedence.
- **Work-conserving for the good.** Need still uncovered once every share is spent goes to the senders judged good,
  beyond their share (the same order): one good publisher alone still fills a refill. With none judged good offering
  a record, it goes to any sender: a reader that judged no one yet (a node's first steps) still fills its take.
- **Bytes count as groups.** A record's size is the sender's word too (announced, and checked when it arrives), and a
  group may be large (64 completions of 32,768 characters): counted in groups alone, one sender within its share could
  make each record of one group 3 MiB, every refill tens of megabytes. A record is credited with its claimed groups or
  its size over ``group_bytes`` (``refill_group_bytes``), whichever is more (:func:`weight`), so large records reach
  their sender's share sooner. A record is still fetched when less than it counts for is left of its sender's share
  (an honest task with long completions is read, in fewer records).
- **Shares last until the caller's next take.** The refills between two takes plan against what the records begun
  since the take spent (:class:`Spent`: counted when a fetch begins, set to what the record truly weighs when it
  arrives, given back if its host answered without it): a sender at its share gets nothing more until the take, and
  beyond the shares only what the good (and the pool) did not spend is left. So one sender costs the refills of a take
  its share of ``need * group_bytes`` and at most one record beyond it in each of the two passes, however often they
  poll; and a spare to hedge a slow fetch with fits what is left of its sender's share. Left: a size is checked once
  the bytes arrived, so a record announced small, or not announced by a sender none of whose records arrived yet,
  costs up to the record limit (3 MiB) before it counts for what it weighs: once per identity (a lie is a strike).

The groups a refill brings are handed to the caller by the same rules (:func:`fair_take`, each group an offer of
one, every ``turn`` the same): a record that truly holds many groups, fetched for its sender's share, takes no more
than that share of a take while other senders' groups wait; what is left of a take once every share is spent goes to
any sender. There every fresh group comes before any stale one (made before the caller's fresh window), not only
within a round: a leftover from steps ago is taken within its sender's share, never before a fresh group.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Offer(Generic[T]):
    """One record a sender offers to a refill.

    Parameters:
        item: what the caller fetches if it is chosen (a :class:`swarm.sender_state.Choice`).
        sender (`str`): its sender.
        claimed (`int`): the groups its sender claims it holds.
        date (`float`): its date, at most the reader's now.
        urgent (`bool`): heard ``fetch_heard_within`` seconds ago or more and still unfetched (a poll before the
            refill is due fetches such records of the refill's plan at once: :meth:`swarm.senders.SenderBook.choose`).
        trusted (`bool`): its sender was judged good (its own share; else the unjudged pool).
        turn (`float`): its sender's place in the queue for turns (the fetches the reader had begun at its last
            fetch from the sender, or when it first heard of it): the lowest goes first, the date breaking ties.
        stale (`bool`): older than the reader's fresh window (:class:`swarm.senders.SenderBook`'s ``fresh_within``):
            it goes after every fresh record of the same round.
        size (`int`): its bytes, as announced or as its sender's records fetched so far suggest (0: not known).
    """

    item: T
    sender: str
    claimed: int
    date: float
    urgent: bool
    trusted: bool
    turn: float = 0.0
    stale: bool = False
    size: int = 0


def _order(offer: Offer) -> tuple[bool, float, float]:
    """Fresh records first; among them, and then among the stale, the sender whose turn came longest ago first, then
    the freshest."""
    return offer.stale, offer.turn, -offer.date


def _freshest(offer: Offer) -> float:
    return -offer.date


def fresh_window(step: float | None, heard_within: float) -> float | None:
    """Seconds within which a record counts as fresh for a caller stepping every ``step`` seconds (``None``: not
    known yet, every record is fresh): its step, and at least ``heard_within`` (``fetch_heard_within``), so that a
    slow publisher's record, made once in its own long step, is not stale at a fast reader's next refill."""
    return None if step is None else max(step, heard_within)


def weight(claimed: int, size: int, group_bytes: int) -> int:
    """The groups a record of ``claimed`` groups and ``size`` bytes counts for: its claim or its size over
    ``group_bytes``, whichever is more (at least one; ``group_bytes`` 0: its claim)."""
    by_size = -(-size // group_bytes) if group_bytes > 0 else 0
    return max(1, claimed, by_size)


def share(need: int, fraction: float) -> int:
    """The groups a share of ``fraction`` of a refill for ``need`` groups credits: at least one."""
    return max(1, math.ceil(need * fraction))


def round_robin(by_sender: dict[str, list[Offer]]) -> list[Offer]:
    """Every sender's offers in turn, one per round (each sender's freshest first), each round by turn, then freshest
    first (the order of ``by_sender`` breaks ties: shuffle it)."""
    queues = {sender: sorted(offers, key=_freshest) for sender, offers in by_sender.items()}
    ordered: list[Offer] = []
    depth = 0
    while True:
        heads = [offers[depth] for offers in queues.values() if depth < len(offers)]
        if not heads:
            return ordered
        ordered += sorted(heads, key=_order)
        depth += 1


@dataclass(frozen=True)
class Spent:
    """What senders spent of a take's need before a refill: the groups their records whose fetch began since the
    caller's last take count for (:func:`weight`, whatever became of them), and which senders are judged good.

    Parameters:
        by_sender (`Mapping[str, int]`): the groups each sender's records begun count for.
        trusted (`frozenset[str]`): the senders judged good (the others spend of the pool).
    """

    by_sender: Mapping[str, int] = field(default_factory=dict)
    trusted: frozenset[str] = frozenset()

    def covering(self, caps: Caps) -> tuple[int, int]:
        """The need the senders judged good and those in the pool cover, each sender counted up to its share (of the
        pool, for one not judged good) and the pool up to its size."""
        good = sum(min(n, caps.per_sender) for sender, n in self.by_sender.items() if sender in self.trusted)
        pooled = sum(min(n, caps.per_pooled) for sender, n in self.by_sender.items() if sender not in self.trusted)
        return good, min(pooled, caps.pool)


class Caps(NamedTuple):
    """A refill's shares, in groups: one sender judged good's, the pool's, and one pooled sender's."""

    per_sender: int
    pool: int
    per_pooled: int


def caps(need: int, sender_share: float, unjudged_share: float, any_trusted: bool) -> Caps:
    """The shares of a refill for ``need`` groups: the pool is reserved for the senders not judged good, but never
    the whole need while one judged good is there (``any_trusted``); within it, one sender's share is of the pool (a
    share of the need would let one claim cover the pool)."""
    pool = min(share(need, unjudged_share), need - 1) if any_trusted else need
    return Caps(share(need, sender_share), pool, share(pool, sender_share))


def covered(need: int, spent: Spent, sender_share: float, unjudged_share: float) -> int:
    """The groups of ``need`` that ``spent`` covers, as :func:`plan_refill` counts them (each sender up to its share,
    the pool up to its size), so that what one sender's records count for beyond its share leaves the other senders'
    shares wanted."""
    if need <= 0:
        return 0
    good, pooled = spent.covering(caps(need, sender_share, unjudged_share, bool(spent.trusted)))
    return min(need, good + pooled)


def room(offer: Offer, spent: Spent, shares: Caps) -> int:
    """The groups ``offer``'s sender may still be credited with in the refills until the caller's next take (of
    ``shares``): its share less what it spent (for a sender not judged good, its share of the pool, and at most what
    is left of the pool)."""
    if offer.trusted:
        return shares.per_sender - spent.by_sender.get(offer.sender, 0)
    pool_left = shares.pool - spent.covering(shares)[1]
    return min(shares.per_pooled - spent.by_sender.get(offer.sender, 0), pool_left)


def plan_refill(
    by_sender: dict[str, list[Offer]],
    need: int,
    sender_share: float,
    unjudged_share: float,
    group_bytes: int = 0,
    spent: Spent = Spent(),
    stale_last: bool = False,
) -> tuple[list[Offer], list[Offer]]:
    """The offers to fetch for ``need`` groups (see the module docstring), in the round-robin's order, and the others
    in that order (spares to hedge a slow fetch with); a record counts for :func:`weight` groups (``group_bytes`` 0:
    for its claim). ``spent``: what the records begun since the caller's last take spent of ``need`` already; a sender
    at its share gets nothing more, and beyond the shares only what the good and the pool did not spend is left (with
    no sender judged good offering: what no one spent). ``stale_last``: the round-robin of the fresh offers, then
    that of the stale ones (by default a stale offer goes last within its round only)."""
    if stale_last:
        fresh = {sender: [offer for offer in offers if not offer.stale] for sender, offers in by_sender.items()}
        stale = {sender: [offer for offer in offers if offer.stale] for sender, offers in by_sender.items()}
        ordered = round_robin(fresh) + round_robin(stale)
    else:
        ordered = round_robin(by_sender)
    if need <= 0:
        return [], ordered
    any_trusted = any(offer.trusted for offer in ordered)
    shares = caps(need, sender_share, unjudged_share, any_trusted)
    good_before, pooled_before = spent.covering(shares)
    credited: Counter[str] = Counter(spent.by_sender)
    taken: set[int] = set()

    def take(offers: list[Offer], budget: int, cap: int | None) -> int:
        used = 0
        for offer in offers:
            left = budget - used
            if left <= 0:
                break
            if cap is not None:
                left = min(left, cap - credited[offer.sender])
            if left <= 0 or id(offer) in taken:
                continue
            credit = min(weight(offer.claimed, offer.size, group_bytes), left)
            taken.add(id(offer))
            credited[offer.sender] += credit
            used += credit
        return used

    trusted = [offer for offer in ordered if offer.trusted]
    covered_now = take(
        [offer for offer in ordered if not offer.trusted], shares.pool - pooled_before, shares.per_pooled
    )
    covered_now += take(trusted, need - good_before - pooled_before - covered_now, cap=shares.per_sender)
    # what is left of the need: the good beyond their share, less what they spent beyond it (a stranger's spend beyond
    # its share of the pool is its own, never the good's); with no sender judged good offering, any sender, less all
    # that was spent
    if any_trusted:
        beyond = sum(n for sender, n in spent.by_sender.items() if sender in spent.trusted) + pooled_before
        take(trusted, need - beyond - covered_now, cap=None)
    else:
        take(ordered, need - sum(spent.by_sender.values()) - covered_now, cap=None)
    return [offer for offer in ordered if id(offer) in taken], [offer for offer in ordered if id(offer) not in taken]


def fair_take(by_sender: dict[str, list[Offer]], need: int, sender_share: float, unjudged_share: float) -> list[Offer]:
    """Up to ``need`` of the offers, each crediting one group (``claimed`` 1): first as :func:`plan_refill` chooses
    them (every sender within its share, the senders not judged good within their pool), then, while some of the need
    is left, the rest in the round-robin's order whoever sent them, so that a take is never smaller than what is
    there to take. Stale offers go after every fresh one (``stale_last``): a group left over from steps ago is handed
    out within its sender's share, or for what the fresh groups leave of the need, never before a fresh sender's
    second group."""
    chosen, others = plan_refill(by_sender, need, sender_share, unjudged_share, stale_last=True)
    return chosen + others[: max(0, need - len(chosen))]
