"""Re-deriving received groups: the spend that rests a sender, how it decays, the bound on senders kept, the
newcomers' shared rest, and the order and rests inside a trainer that takes real optimizer steps."""

from __future__ import annotations

import itertools
import json
import time
from types import SimpleNamespace

import pytest

from sapo import SAPOTrainer, rederivation
from sapo.models import build_tiny_model
from sapo.rederivation import RederivationCosts, RoundRederivation
from sapo.sources import DatasetSource, ReasoningGymSource, SourceRegistry
from sapo.standing import SenderStanding
from sapo.tasks import TaskSpec, build_reasoning_gym_dataset
from swarm import Group, MemorySwarm, Provenance
from swarm.records import ReceivedGroup, provenance_from_wire
from testbed.tiny_run import tiny_config


def _two_rounds(tmp_path, tokenizer, reward, source, swarm, each_round):
    """A trainer that took two real steps, one external slot a round from a pool of 8, a sender rested at 0.5 s."""
    trainer = SAPOTrainer(
        model=build_tiny_model(tokenizer, seed=0), reward_funcs=[reward],
        args=tiny_config(tmp_path / "out", num_local=1, num_external=1, max_steps=2, external_pool_size=8,
                         plausibility_margin=None, sender_rederivation_seconds=0.5),
        train_dataset=source.rows(), processing_class=tokenizer, sources=[source], swarm=swarm, callbacks=[each_round],
    )  # fmt: skip
    trainer.train()
    return trainer


def spread(completions, **kw):
    """A reward with spread: a usable group is taken."""
    return [float(k) for k in range(len(completions))]


class SlowCostly(DatasetSource):
    """A dataset whose items say they are costly (as a config the sender chose would be) and take a second each to
    re-derive, on a clock (``clock[0]``) the test gives :mod:`sapo.rederivation`."""

    def __init__(self, rows, name, clock):
        super().__init__(rows, name)
        self.clock = clock

    def costly(self, provenance):
        return True

    def rederive(self, provenance, question):
        self.clock[0] += 1.0
        return super().rederive(provenance, question)


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


def test_items_a_source_raises_on_rest_their_sender_and_never_stop_a_node_that_re_derives_others():
    """A user's generator with a rare bug: a peer that finds the items it raises on (offline, in a second) and sends
    only those stopped the node at `max_source_errors` (a count that never decayed), and was never rested (an error
    takes microseconds). Now each such group costs its sender `SOURCE_ERROR_SECONDS`, so it is rested after a few,
    and the limit counts errors in a row: another sender's items re-derived between start it again."""

    class Fragile(DatasetSource):
        def rederive(self, provenance, question):
            if question.endswith("13?"):
                raise ZeroDivisionError("a rare item")
            return super().rederive(provenance, question)

    sums = Fragile([{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(14)], "sums")
    registry = SourceRegistry([sums], max_source_errors=3)
    rederive = RoundRederivation(registry, RederivationCosts(allowance=2.5))
    rows = list(sums.rows())
    fragile = next(row for row in rows if row["prompt"][-1]["content"].endswith("13?"))

    def group(sender, row, n):
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        return ReceivedGroup(sender, Group(f"{sender}-{n}", [row["prompt"][-1]], ["1", "2"], provenance))

    for round_ in range(4):  # each round: the hostile sender's 3 groups (taking turns with) an honest sender's 3
        received = [group("hostile", fragile, 3 * round_ + k) for k in range(3)]
        received += [group("honest", rows[k], 3 * round_ + k) for k in range(3)]
        truths = rederive.truths(received)
        assert all(isinstance(truth, dict) for truth in truths[3:])
        reasons = [truth.reason for truth in truths[:3]]
        assert reasons == (["source_error"] * 3 if round_ == 0 else ["rederivation_cost"] * 3), (round_, reasons)
    assert registry.source_errors == 3 and registry.source_errors_in_a_row == 0


def test_the_budget_goes_to_a_sender_found_usable_before_new_identities_fetched_first(
    tmp_path, smollm_tokenizer, monkeypatch
):
    """New identities cost nothing to make: three of them, whose foreign groups are fetched first, do not spend the
    round's `regeneration_budget` before the group of a sender whose group this node trained on a step earlier. A clock
    that moves 20 s between readings stands in for slow entries (one fits a budget of 10 s); the regeneration is
    real."""
    from transformers import TrainerCallback

    from sapo import regeneration

    clock = itertools.count(step=20.0)
    monkeypatch.setattr(regeneration, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    own = TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 1})
    foreign = build_reasoning_gym_dataset([TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 2})], size=4)
    own_rows = build_reasoning_gym_dataset([own], size=8)
    swarm = MemorySwarm(seed=0)
    known, strangers = swarm.join("known"), [swarm.join(f"new-{k}") for k in range(3)]

    def group(row, gid, age):
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        return Group(gid, [row["prompt"][-1]], ["1", "22", "3", "4"], provenance, created_at=time.time() - age)

    known.publish([group(own_rows[0], "k-0", age=5)])  # step 1: its own-config group, trained on

    class SecondRound(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:
                known.publish([group(foreign[0], "k-1", age=5)])
                for k, stranger in enumerate(strangers):
                    stranger.publish([group(foreign[k + 1], f"n-{k}", age=0)])  # newer: fetched first

    trainer = SAPOTrainer(
        model=build_tiny_model(smollm_tokenizer, seed=0), reward_funcs=[spread],
        args=tiny_config(tmp_path / "out", num_local=1, num_external=1, max_steps=2, external_pool_size=16,
                         plausibility_margin=None, regeneration_budget=10.0),
        train_dataset=own_rows, processing_class=smollm_tokenizer, swarm=swarm.join("me"), callbacks=[SecondRound()],
    )  # fmt: skip
    trainer.train()
    senders = trainer.intake.sender_outcomes
    assert senders["known"] == {"taken": 2}, senders
    assert all(senders[f"new-{k}"] == {"dropped/regeneration_budget": 1} for k in range(3)), senders


def test_a_sender_whose_groups_cost_too_much_to_regenerate_is_rested_not_benched(tmp_path, smollm_tokenizer):
    """One sender names a new costly config in every group (2 million scramble moves: minutes to regenerate), so none
    is remembered as past a limit and each would cost a whole `regeneration_timeout`. Once its groups cost
    `sender_rederivation_seconds` of re-derivation, its later groups are set aside unread (`rederivation_cost`) and the
    honest sender's group is taken; the rest never counts against its standing. Real regeneration."""
    rows = build_reasoning_gym_dataset([TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 1})], size=4)
    swarm = MemorySwarm(seed=0)
    honest, costly = swarm.join("honest"), swarm.join("costly")

    def group(gid, provenance, question, age=0.0):
        return Group(gid, [{"role": "user", "content": question}], ["1", "22", "3", "4"], provenance,
                     created_at=time.time() - age)  # fmt: skip

    row = rows[0]
    honest.publish([group("h-0", provenance_from_wire(json.loads(row["provenance"])), row["prompt"][-1]["content"], 5)])
    configs = [{"min_scramble_steps": 2_000_000 + k, "max_scramble_steps": 2_000_000 + k} for k in range(4)]
    cube = [Provenance("reasoning_gym", "rubiks_cube", config, 1, 0) for config in configs]
    costly.publish([group(f"c-{k}", provenance, "Solve this cube.") for k, provenance in enumerate(cube)])

    trainer = SAPOTrainer(
        model=build_tiny_model(smollm_tokenizer, seed=0), reward_funcs=[spread],
        args=tiny_config(tmp_path / "out", num_local=1, num_external=1, max_steps=1, external_pool_size=16,
                         sender_drop_limit=2, sender_window=10, plausibility_margin=None, regeneration_timeout=1.0,
                         regeneration_budget=30.0, sender_rederivation_seconds=0.5),
        train_dataset=rows, processing_class=smollm_tokenizer, swarm=swarm.join("me"),
    )  # fmt: skip
    trainer.train()
    totals, senders = trainer.swarm_totals, trainer.intake.sender_outcomes
    # its first group's limit (1 s, the child's start besides) passes 0.5 s: the other three are never run
    assert senders["costly"] == {"dropped/regeneration_limit": 1, "dropped/rederivation_cost": 3}, senders
    assert senders["honest"] == {"taken": 1}, senders
    assert totals["dropped/rederivation_cost"] == 3 and trainer.intake.standing.benched(time.time()) == []


def test_new_identities_share_one_rest_for_costly_configs_that_spares_own_configs_and_known_senders():
    """Identities cost nothing to make: four new ones, each naming a new costly config, cost what one sender does.
    Once the first one's config has run to its limit (1 s, over the newcomers' allowance of 0.5 s), the other new
    identities' costly groups are set aside unread (`rederivation_cost`), a newcomer's group of this peer's own config
    is still re-derived, and so is a foreign config of a sender found usable. A newcomer's cheap foreign config waits
    out the rest with the others: the rest cannot tell it from a costly one before running it. Real regeneration."""
    own = TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 1})
    foreign = build_reasoning_gym_dataset([TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 2})], size=2)
    own_row = build_reasoning_gym_dataset([own], size=1)[0]
    sources = SourceRegistry([ReasoningGymSource([own], regeneration_timeout=1.0, regeneration_budget=None)])
    standing = SenderStanding()
    standing.record("known", usable=True, now=time.time())
    rederive = RoundRederivation(
        sources, RederivationCosts(allowance=100.0), standing, newcomers=RederivationCosts(allowance=0.5)
    )

    def group(sender, row=None, moves=None):
        if row is not None:
            provenance, question = provenance_from_wire(json.loads(row["provenance"])), row["prompt"][-1]["content"]
        else:
            config = {"min_scramble_steps": moves, "max_scramble_steps": moves}
            provenance, question = Provenance("reasoning_gym", "rubiks_cube", config, 1, 0), "Solve this cube."
        return ReceivedGroup(
            sender, Group(f"{sender}-g", [{"role": "user", "content": question}], ["1", "2"], provenance)
        )

    received = [group(f"new-{k}", moves=2_000_000 + k) for k in range(4)]
    received += [group("new-own", own_row), group("new-foreign", foreign[0]), group("known", foreign[1])]
    fates = zip(received, rederive.truths(received), strict=True)
    outcome = {item.sender: "kept" if isinstance(truth, dict) else truth.reason for item, truth in fates}
    assert outcome == {
        "new-0": "regeneration_limit",  # run to its limit: 1 s and the child's start, the newcomers rested
        **{f"new-{k}": "rederivation_cost" for k in (1, 2, 3)},
        "new-own": "kept",
        "new-foreign": "rederivation_cost",
        "known": "kept",  # found usable: re-derived first, never rested with the newcomers
    }, outcome
    assert not rederive.costs.is_rested("new-0", time.time())  # each newcomer alone is far under its own allowance


def test_costly_items_re_derived_but_not_trained_on_are_charged_after_the_round(monkeypatch):
    """A source's costly items (`TaskSource.costly`: a config the sender chose) that re-derive correctly but slowly,
    and whose groups are then dropped (too few completions, zero advantage), cost their sender as items that could not
    be re-derived: charged when the round settles, unless trained on. Items of this peer's own kind never are. The
    source's 1 s an item is a clock it moves; the re-derivation is real."""
    clock = [0.0]
    monkeypatch.setattr(rederivation, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))

    rows = [{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(6)]
    slow = SlowCostly(rows, "slow", clock)
    own = DatasetSource([{"question": f"What is {k} * 3?", "answer": str(3 * k)} for k in range(6)], "own")
    rederive = RoundRederivation(
        SourceRegistry([slow, own]), RederivationCosts(allowance=2.5), newcomers=RederivationCosts(allowance=100.0)
    )

    def group(sender, source, k):
        row = list(source.rows())[k]
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        return ReceivedGroup(sender, Group(f"{sender}-{k}", [row["prompt"][-1]], ["1", "2"], provenance))

    first = [group("dropper", slow, k) for k in range(3)] + [group("trained", slow, k) for k in range(3)]
    first += [group("own-kind", own, k) for k in range(3)]
    assert all(isinstance(truth, dict) for truth in rederive.truths(first))  # 6 s of costly items, all re-derived
    rederive.settle({id(item.group) for item in first if item.sender == "trained"})
    now = time.time()
    assert rederive.costs.spent("dropper", now) == pytest.approx(3.0, abs=0.01) and rederive.costs.is_rested(
        "dropper", now
    )
    assert rederive.costs.spent("trained", now) == 0.0 and rederive.costs.spent("own-kind", now) == 0.0
    assert rederive.newcomers.spent(rederivation.NEWCOMERS, now) == pytest.approx(3.0, abs=0.01)
    second = rederive.truths([group("dropper", slow, 3), group("trained", slow, 3)])
    assert [getattr(truth, "reason", "kept") for truth in second] == ["rederivation_cost", "kept"]


class HeavyTailed(DatasetSource):
    """A user's own data whose items take 0.01 s to re-derive, and the few of them asking about 13, 10 s: a source of
    this peer's own kind (not costly), on a clock (``clock[0]``) the test gives :mod:`sapo.rederivation`."""

    def __init__(self, rows, name, clock):
        super().__init__(rows, name)
        self.clock = clock

    def rederive(self, provenance, question):
        self.clock[0] += 10.0 if "13" in question else 0.01
        return super().rederive(provenance, question)


def test_an_item_of_this_peers_own_kind_costs_its_sender_only_beyond_the_rounds_usual(monkeypatch):
    """Items of this peer's own kind are free up to what is usual for them (honest senders, drawing items as they come,
    never rest however slow the source), but a sender that picks a user's generator's rare slow items is charged what
    they cost beyond that: 10 s an item, where the honest sender's cost 0.01 s, rests it after two rounds."""
    clock = [0.0]
    monkeypatch.setattr(rederivation, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    source = HeavyTailed([{"question": f"What is {k} + 1?", "answer": str(k + 1)} for k in range(20)], "own", clock)
    rederive = RoundRederivation(SourceRegistry([source]), RederivationCosts(allowance=15.0))
    rows = list(source.rows())

    def group(sender, k):
        provenance = provenance_from_wire(json.loads(rows[k]["provenance"]))
        return ReceivedGroup(sender, Group(f"{sender}-{k}", [rows[k]["prompt"][-1]], ["1", "2"], provenance))

    for _ in range(2):
        truths = rederive.truths([group("honest", k) for k in (1, 2, 3)] + [group("picker", 13)])
        assert all(isinstance(truth, dict) for truth in truths)  # every item re-derived: it is not wrong, only slow
    now = time.time()
    assert rederive.costs.spent("honest", now) == 0.0
    assert rederive.costs.spent("picker", now) == pytest.approx(2 * (10.0 - 0.5), abs=0.01)  # beyond 0.5 s free
    assert rederive.costs.is_rested("picker", now)
    third = rederive.truths([group("honest", 4), group("picker", 13)])
    assert [getattr(truth, "reason", "kept") for truth in third] == ["kept", "rederivation_cost"]
    # A source slow for every item costs nothing: the usual is then slow too (a verifier that runs code).
    clock[0], slow = 0.0, RoundRederivation(SourceRegistry([source]), RederivationCosts(allowance=15.0))
    assert all(isinstance(t, dict) for t in slow.truths([group("a", 13), group("b", 13), group("a", 13)]))
    assert slow.costs.spent("a", time.time()) == slow.costs.spent("b", time.time()) == 0.0


def test_a_costly_item_is_spared_by_its_own_group_taken_never_by_a_group_id_and_held_ones_pay_on_leaving(monkeypatch):
    """What spares a costly item its charge is its own group taken: a sender that gave all its groups one id had one
    group taken spare them all (the id is the sender's to choose), and one held for a later round was never charged when
    it left the hold unused. 1 s an item on a clock the source moves; the re-derivation is real."""
    clock = [0.0]
    monkeypatch.setattr(rederivation, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    rows = [{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(6)]
    slow = SlowCostly(rows, "slow", clock)
    rederive = RoundRederivation(SourceRegistry([slow]), RederivationCosts(allowance=100.0))

    def group(k):
        row = list(slow.rows())[k]
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        return ReceivedGroup("same-id", Group("one-id", [row["prompt"][-1]], ["1", "2"], provenance))

    items = [group(k) for k in range(4)]
    assert all(isinstance(truth, dict) for truth in rederive.truths(items))
    rederive.settle(taken={id(items[0].group)}, held={id(items[1].group)})
    assert rederive.costs.spent("same-id", time.time()) == pytest.approx(
        2.0, abs=0.01
    )  # the two neither taken nor held
    rederive.settle(taken=set(), held={id(items[1].group)})  # a round later: still held, not yet charged
    assert rederive.costs.spent("same-id", time.time()) == pytest.approx(2.0, abs=0.01)
    rederive.settle(taken=set(), held=set())  # pushed out of the hold unused
    assert rederive.costs.spent("same-id", time.time()) == pytest.approx(3.0, abs=0.01)


def test_a_trainer_charges_a_sender_whose_costly_groups_re_derive_but_are_never_usable(
    tmp_path, smollm_tokenizer, monkeypatch
):
    """Inside a trainer taking real steps: a sender whose costly items re-derive (1 s each, a clock the source moves)
    but whose groups have zero advantage is charged once the round's verdicts are in, and rested at the next round,
    never benched for it."""
    from transformers import TrainerCallback

    clock = [0.0]
    monkeypatch.setattr(rederivation, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))

    questions = SlowCostly([{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(8)], "sums", clock)
    rows = list(questions.rows())
    swarm = MemorySwarm(seed=0)
    dropper = swarm.join("dropper")

    def flat(row, gid):  # four equal completions: zero advantage under any reward
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        return Group(gid, [row["prompt"][-1]], ["4"] * 4, provenance, created_at=time.time())

    class EachRound(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            dropper.publish([flat(rows[2 * state.global_step + k], f"d-{state.global_step}-{k}") for k in range(2)])

    def by_text(completions, **kw):  # equal completions, equal rewards
        return [float(len(completion[-1]["content"])) for completion in completions]

    trainer = _two_rounds(tmp_path, smollm_tokenizer, by_text, questions, swarm.join("me"), EachRound())
    senders = trainer.intake.sender_outcomes
    assert senders["dropper"] == {"dropped/zero_advantage": 2, "dropped/rederivation_cost": 2}, senders
    assert trainer.intake.standing.benched(time.time()) == []


def test_scoring_beyond_what_is_free_is_charged_and_a_slow_judge_charges_nobody():
    """A group that takes this peer's rewards longer than the larger of 0.5 s and 4 times the cheapest sender's median
    is charged the rest to its sender, used or not; with a slow reward every group costs about as much, and none is."""
    excess = rederivation.scoring_excess
    assert excess([("a", 0.002), ("b", 0.003), ("a", 0.001), ("c", 1.6)]) == pytest.approx([0.0, 0.0, 0.0, 1.1])
    assert excess([("a", 2.0), ("b", 2.5), ("c", 1.8), ("a", 3.0)]) == [0.0] * 4  # a judge model: 2-3 s a group
    # one sender's many slow groups do not make slowness the usual: the cheapest sender's median is
    assert excess([("slow", 1.0)] * 4 + [("honest", 0.002)]) == pytest.approx([0.5] * 4 + [0.0])
    assert excess([("slow", 1.0)] * 4) == [0.0] * 4  # alone in the round: its own pace is the usual
    assert excess([]) == []
    standing = SenderStanding()
    standing.record("known", usable=True, now=time.time())
    rederive = RoundRederivation(
        SourceRegistry([DatasetSource([{"question": "What is 1 + 1?", "answer": "2"}], "sums")]),
        RederivationCosts(allowance=1.0), standing, newcomers=RederivationCosts(allowance=100.0),
    )  # fmt: skip
    rederive.charge_scoring([("slow", 1.6), ("known", 0.002), ("new", 0.001), ("known", 0.9), ("new", 0.003)])
    # the median is 3 ms: 0.5 s free. A spend halves every 300 s: read a moment after it was charged (a millisecond on
    # a loaded machine) it has decayed by a few millionths, hence the tolerance
    now, near = time.time(), {"rel": 1e-3}
    assert rederive.costs.spent("slow", now) == pytest.approx(1.1, **near) and rederive.costs.is_rested("slow", now)
    assert rederive.costs.spent("known", now) == pytest.approx(0.4, **near)
    assert not rederive.costs.is_rested("known", now) and rederive.costs.spent("new", now) == 0.0
    # a sender not found usable adds to the newcomers' account too; one found usable does not
    assert rederive.newcomers.spent(rederivation.NEWCOMERS, now) == pytest.approx(1.1, **near)


def test_a_trainer_rests_a_sender_whose_answers_keep_its_reward_busy(tmp_path, smollm_tokenizer):
    """Inside a trainer taking real steps: a sender whose completions make this peer's reward spend 0.3 s each (a
    reward that really sleeps on its text) is charged what its group cost beyond what is free and rested at the next
    round; the honest senders beside it are never charged, and nobody is benched."""
    from transformers import TrainerCallback

    questions = DatasetSource([{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(16)], "sums")
    rows = list(questions.rows())
    swarm = MemorySwarm(seed=0)
    honest, slow = [swarm.join(f"honest-{k}") for k in range(3)], swarm.join("slow")

    def group(row, gid, word):
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        completions = [f"{word} {'x' * k}" for k in range(4)]  # rewards with spread: a usable group
        return Group(gid, [row["prompt"][-1]], completions, provenance, created_at=time.time())

    class EachRound(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            step = state.global_step
            for k, peer in enumerate(honest):
                peer.publish([group(rows[4 * step + k], f"h{k}-{step}", "four")])
            slow.publish([group(rows[4 * step + 3], f"s-{step}", "SLOW")])

    def by_text(completions, **kw):
        texts = [completion[-1]["content"] for completion in completions]
        time.sleep(0.3 * sum("SLOW" in text for text in texts))  # what the sender's text makes this reward spend
        return [float(len(text)) for text in texts]

    trainer = _two_rounds(tmp_path, smollm_tokenizer, by_text, questions, swarm.join("me"), EachRound())
    senders = trainer.intake.sender_outcomes
    assert senders["slow"].get("dropped/rederivation_cost") == 1, senders  # the second round's group, set aside unread
    assert not any("dropped/rederivation_cost" in senders.get(f"honest-{k}", {}) for k in range(3)), senders
    assert trainer.intake.standing.benched(time.time()) == []
