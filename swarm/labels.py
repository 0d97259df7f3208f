"""Bounded metric labels: figures kept per sender, folded into the top senders and "other" before they become labels.

Identities are free in an open swarm, so a metric labelled by sender (groups taken, dropped by reason) would grow one
series per identity ever met: a peer that makes up a new identity for every record would grow a node's metrics, and
its monitoring's storage, without bound. :func:`top_senders` keeps the senders with the largest totals and sums the
rest under :data:`OTHER`, so a scrape has at most ``keep + 1`` senders whatever the swarm does.
"""

from __future__ import annotations

from collections.abc import Mapping

OTHER = "other"
"""The label of every sender beyond the top ones."""

DEFAULT_KEEP = 20
"""Senders kept by name by default."""


def top_senders(per_sender: Mapping[str, Mapping[str, float]], keep: int = DEFAULT_KEEP) -> dict[str, dict[str, float]]:
    """``per_sender`` (figures by name, per sender) with at most ``keep`` senders named: those with the largest sum of
    figures (ties broken by name), every other sender's figures summed under :data:`OTHER`. A sender already named
    ``"other"`` is folded in with the rest.

    Raises:
        ValueError: ``keep`` is negative.
    """
    if keep < 0:
        raise ValueError(f"keep={keep}: the number of senders kept by name must be 0 or more")
    ranked = sorted(
        (sender for sender in per_sender if sender != OTHER),
        key=lambda sender: (-sum(per_sender[sender].values()), sender),
    )
    kept = {sender: dict(per_sender[sender]) for sender in ranked[:keep]}
    rest = [sender for sender in per_sender if sender not in kept]
    if rest:
        other: dict[str, float] = {}
        for sender in rest:
            for name, value in per_sender[sender].items():
                other[name] = other.get(name, 0) + value
        kept[OTHER] = other
    return kept
