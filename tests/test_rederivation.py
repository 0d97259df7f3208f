"""Per-sender re-derivation cost: the spend that rests a sender, how it decays, and the bound on senders kept."""

from __future__ import annotations

import pytest

from sapo import rederivation
from sapo.rederivation import RederivationCosts


def test_a_sender_is_rested_at_its_allowance_until_its_spend_halves_back_under_it():
    costs = RederivationCosts(allowance=15.0, half_life=300.0)
    costs.spend("slow", 10.0, now=0.0)
    assert not costs.is_rested("slow", 0.0) and costs.rest_left("slow", 0.0) == 0.0
    costs.spend("slow", 10.0, now=0.0)  # 20 s: rested while 20 * 2**(-t/300) > 15, t < 300 * log2(4/3) = 124.5 s
    assert costs.is_rested("slow", 0.0) and costs.rest_left("slow", 0.0) == pytest.approx(124.5, abs=0.1)
    assert costs.is_rested("slow", 124.0) and not costs.is_rested("slow", 125.0)
    assert costs.spent("slow", 300.0) == pytest.approx(10.0)  # one half-life
    assert costs.spent("never", 300.0) == 0.0 and not costs.is_rested("never", 300.0)


def test_many_cheap_groups_never_rest_an_honest_sender():
    """Sixteen groups a round at 5 ms each, a round every 10 s for a day: the spend levels off at 0.08 s over
    1 - 2**(-10/300), 3.5 s, far under the 15 s that rest a sender."""
    costs = RederivationCosts(allowance=15.0)
    for round_ in range(8640):
        for _ in range(16):
            costs.spend("honest", 0.005, now=10.0 * round_)
    assert not costs.is_rested("honest", 86_400.0) and costs.spent("honest", 86_400.0) < 3.6


def test_the_senders_remembered_are_bounded_the_one_that_spent_longest_ago_forgotten(monkeypatch):
    monkeypatch.setattr(rederivation, "MAX_SENDERS", 3)
    costs = RederivationCosts(allowance=1.0)
    for k, sender in enumerate(["a", "b", "c"]):
        costs.spend(sender, 5.0, now=float(k))
    costs.spend("a", 0.0, now=3.0)  # "a" spent again: "b" now spent longest ago
    costs.spend("d", 5.0, now=4.0)
    assert [s for s in "abcd" if costs.is_rested(s, 4.0)] == ["a", "c", "d"]
    costs.spend("e", 0.1, now=5.0)  # rested ones are kept while one that is not can go: here the newcomer itself
    assert [s for s in "acde" if costs.spent(s, 5.0) > 0] == ["a", "c", "d"]


@pytest.mark.parametrize("bad", [dict(allowance=0.0), dict(allowance=-1.0), dict(allowance=1.0, half_life=0.0)])
def test_a_bound_that_is_not_positive_is_refused(bad):
    with pytest.raises(ValueError, match="must be positive"):
        RederivationCosts(**bad)
