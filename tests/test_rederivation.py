"""Per-sender re-derivation cost: the spend that rests a sender, how it decays, and the bound on senders kept."""

from __future__ import annotations

import json
import time

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


def test_a_slow_source_never_rests_the_senders_of_its_items_but_rests_a_forger(monkeypatch):
    """What counts against a sender is the time its groups took to re-derive in vain: a source that takes 50 ms an item
    (a verifier that runs code, say) re-derives an honest sender's groups round after round without resting it, while
    a sender of forged questions on the same source is rested once those cost more than the allowance. The source's
    50 ms are a clock it moves; the re-derivation is real."""
    from types import SimpleNamespace

    from sapo.rederivation import RoundRederivation
    from sapo.sources import DatasetSource, SourceRegistry
    from swarm.records import Group, ReceivedGroup, provenance_from_wire

    clock = [0.0]
    monkeypatch.setattr(rederivation, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))

    class SlowSums(DatasetSource):
        def rederive(self, provenance, question):
            clock[0] += 0.05
            return super().rederive(provenance, question)

    sums = SlowSums([{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(8)], "sums")
    rederive = RoundRederivation(SourceRegistry([sums]), RederivationCosts(allowance=0.12))

    def group(sender, row, question=None):
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        prompt = [{"role": "user", "content": question or row["prompt"][-1]["content"]}]
        return ReceivedGroup(sender, Group(f"{sender}-{row['answer']}", prompt, ["1", "2"], provenance))

    rows = list(sums.rows())
    for _ in range(3):  # three rounds: 24 honest groups, 1.2 s of re-derivation, none in vain
        assert all(isinstance(truth, dict) for truth in rederive.truths([group("honest", row) for row in rows]))
    forged = rederive.truths([group("forger", row, "What is 9 + 9?") for row in rows[1:6]])
    reasons = [truth.reason for truth in forged]
    assert reasons == ["question_mismatch"] * 3 + ["rederivation_cost"] * 2, reasons  # 0.15 s > 0.12 s: rested
