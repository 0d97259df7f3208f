"""Task sources: a receiver re-derives the truth of a shared item from its provenance, whatever its copy's row order,
split or filter; says precisely why when it cannot; and hands the rewards its own columns."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from datasets import Dataset

from sapo.publication import published_prompt
from sapo.questions import GroupDropped, questions_of_rows
from sapo.sources import DatasetSource, GeneratorSource, ReasoningGymSource, SourceRegistry, item_key, mix_rows
from sapo.sources.own import keyed_by_content, registry_for
from sapo.tasks import TaskSpec
from swarm.records import Group, provenance_from_wire, validate_group

RECORDS = [{"question": f"How many metres are {k} km?", "answer": str(1000 * k), "units": "m"} for k in range(1, 41)]


def _group(row: dict, completions=("1000",)) -> Group:
    provenance = provenance_from_wire(json.loads(row["provenance"]))
    return validate_group(Group("0-0", published_prompt(row["prompt"]), list(completions), provenance))


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_items_verify_across_shuffles_splits_and_filters_with_the_receivers_own_columns(tmp_path):
    sender = DatasetSource(_write(tmp_path / "a.jsonl", RECORDS), "km")
    shuffled = RECORDS[:]
    random.Random(1).shuffle(shuffled)
    split = Dataset.from_list(shuffled).train_test_split(test_size=0.2, seed=0)["train"]
    receiver = SourceRegistry([DatasetSource(split.map(lambda r: {"units": "metres"}), "km")])
    held = {item_key(r["question"], r["answer"]) for r in split}
    outcomes = {"verified": 0, "item_not_held": 0}
    for row in sender.rows():
        group = _group(row)
        if group.provenance.key in held:
            columns = receiver.columns_for(group)
            assert columns["answer"] == row["answer"] and columns["question"] == row["prompt"][-1]["content"]
            assert columns["units"] == "metres"  # the receiver's own extra column, not the sender's "m"
            outcomes["verified"] += 1
        else:
            with pytest.raises(GroupDropped) as info:
                receiver.columns_for(group)
            assert info.value.reason == "item_not_held"
            outcomes["item_not_held"] += 1
    assert outcomes == {"verified": 32, "item_not_held": 8}  # never a mismatch


def test_a_forged_question_a_version_skew_and_a_missing_column_say_what_they_are(tmp_path):
    source = DatasetSource(RECORDS, "km", version="2")
    registry = SourceRegistry([source])
    row = source.rows()[0]
    forged = Group(**{**vars(_group(row)), "prompt": [{"role": "user", "content": "What is 2 + 2?"}]})
    with pytest.raises(GroupDropped) as info:
        registry.columns_for(forged)
    assert info.value.reason == "question_mismatch"
    older = DatasetSource(RECORDS[:5] + [{"question": "new?", "answer": "x"}], "km", version="3").rows()[-1]
    with pytest.raises(GroupDropped) as info:
        registry.columns_for(_group(older))
    assert info.value.reason == "version_skew" and "version 3 from the sender, 2 here" in str(info.value)
    with pytest.raises(KeyError, match="column 'answer' missing"):
        DatasetSource([{"question": "x?", "solution": "1"}], "bad")
    with pytest.raises(ValueError, match="needs a name"):
        DatasetSource(RECORDS, "")


def test_held_out_items_are_chosen_by_key_and_never_trained_on():
    source = DatasetSource(RECORDS, "km", eval_fraction=0.25)
    again = DatasetSource(list(reversed(RECORDS)), "km", eval_fraction=0.25)
    train = {r["provenance"] for r in source.rows()}
    held_out = {r["provenance"] for r in source.held_out()}
    assert held_out and train and not train & held_out and len(train) + len(held_out) == len(RECORDS)
    assert held_out == {r["provenance"] for r in again.held_out()}  # every peer holds out the same items
    test_split = DatasetSource(RECORDS[:30], "km", eval_data=RECORDS[30:])
    assert len(test_split) == 30 and len(test_split.held_out()) == 10


def test_an_ordinary_dataset_is_keyed_by_content_so_a_peer_with_the_same_rows_verifies_it():
    rows = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"], "units": "m"} for r in RECORDS]
    )
    keyed = keyed_by_content(rows)
    assert keyed["prompt"] == rows["prompt"]  # prompts and order kept
    other = keyed_by_content(rows.shuffle(seed=3).select(range(30)))
    registry = registry_for(other, None, "verify", None)
    group = _group(keyed[0])
    if group.provenance.key in {provenance_from_wire(json.loads(p)).key for p in other["provenance"]}:
        assert registry.columns_for(group)["units"] == "m"
    not_held = next(r for r in keyed if r["provenance"] not in set(other["provenance"]))
    with pytest.raises(GroupDropped) as info:
        registry.columns_for(_group(not_held))
    assert info.value.reason == "item_not_held"


def test_a_mixture_verifies_each_row_by_its_own_source():
    easy = TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 1})
    rg = ReasoningGymSource([easy]).rows(size=4, seed=0)
    data = DatasetSource(RECORDS[:4], "km").rows()
    mixture = mix_rows([rg, data], seed=0)
    assert set(mixture.column_names) >= {"prompt", "answer", "task", "entry", "provenance", "units"}
    registry = registry_for(mixture, None, "verify", None)
    assert {type(s).__name__ for s in registry.sources} == {"ReasoningGymSource", "DatasetSource"}
    for row in mixture:
        columns = registry.columns_for(_group(row))
        assert columns["answer"] == row["answer"] and columns["task"] == row["task"]


def test_reasoning_gym_provenance_carries_its_version_and_a_skew_is_told_apart_from_a_mismatch():
    easy = TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 1})
    source = ReasoningGymSource([easy])
    row = source.rows(size=2, seed=0)[0]
    provenance = provenance_from_wire(json.loads(row["provenance"]))
    assert provenance.version == source.version and source.version != "unknown"
    registry = SourceRegistry([source])
    changed = Group(**{**vars(_group(row)), "prompt": [{"role": "user", "content": "What is 9 + 9?"}]})
    with pytest.raises(GroupDropped) as info:
        registry.columns_for(changed)
    assert info.value.reason == "question_mismatch"
    skewed = Group(**{**vars(changed), "provenance": provenance_from_wire({**json.loads(row["provenance"]),
                                                                           "version": "0.0.1"})})  # fmt: skip
    with pytest.raises(GroupDropped) as info:
        registry.columns_for(skewed)
    assert info.value.reason == "version_skew"


class Multiply(GeneratorSource):
    name, version = "multiply", "1"

    def generate(self, rng):
        a, b = rng.randint(2, 99), rng.randint(2, 9)
        return {"question": f"What is {a} * {b}?", "answer": str(a * b), "factors": [a, b]}


def test_a_users_generator_is_regenerated_by_the_receiver_with_its_own_columns():
    sender = Multiply()
    rows = sender.rows(size=5, seed=7)
    assert rows[0]["prompt"][-1]["content"].startswith("What is") and "factors" in rows.column_names
    registry = SourceRegistry([Multiply()])
    for row in rows:
        columns = registry.columns_for(_group(row))
        assert columns["answer"] == row["answer"] and columns["factors"] == row["factors"]
    assert not {r["prompt"][-1]["content"] for r in sender.held_out(5)} & {r["prompt"][-1]["content"] for r in rows}
    with pytest.raises(GroupDropped) as info:
        SourceRegistry([Multiply(config={"hard": True})]).columns_for(_group(rows[0]))
    assert info.value.reason == "unknown_task"
    with pytest.raises(GroupDropped) as info:
        SourceRegistry().columns_for(_group(rows[0]))
    assert info.value.reason == "unknown_source"

    class Nameless(GeneratorSource):
        def generate(self, rng):
            return {}

    with pytest.raises(TypeError, match="must set a class attribute `name`"):
        Nameless()


def test_an_item_missing_from_a_differently_named_copy_is_not_held_and_only_given_sources_are_held(tmp_path):
    sender = DatasetSource(_write(tmp_path / "a.jsonl", RECORDS), "a")
    shuffled = RECORDS[:]
    random.Random(2).shuffle(shuffled)
    receiver_source = DatasetSource(_write(tmp_path / "b.jsonl", shuffled[:32]), "b")
    receiver = registry_for(receiver_source.rows(), [receiver_source], "verify", None)
    assert [type(s).__name__ for s in receiver.sources] == ["DatasetSource"]  # no reasoning-gym unless asked for
    reasons = set()
    for row in sender.rows():
        try:
            receiver.columns_for(_group(row))
            reasons.add("verified")
        except GroupDropped as e:
            reasons.add(e.reason)
            assert "no dataset held here has item" in e.detail
    assert reasons == {"verified", "item_not_held"}  # never unknown_source: the receiver holds a dataset
    easy = TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 1})
    with pytest.raises(GroupDropped) as info:
        receiver.columns_for(_group(ReasoningGymSource([easy]).rows(size=1, seed=0)[0]))
    assert info.value.reason == "unknown_source"


class Flaky(GeneratorSource):
    name, version = "flaky", "1"

    def generate(self, rng):
        a = rng.randint(0, 9)
        return {"question": f"What is {a} + 1?", "answer": str(a + 1)}


def test_a_source_that_raises_drops_the_group_and_stops_training_past_its_limit(caplog):
    from sapo.sources.base import SourceErrorLimit

    source = Flaky()
    rows = source.rows(size=3)
    registry = SourceRegistry([source], max_source_errors=1)
    source.generate = lambda rng: 1 / 0  # the receiver's copy breaks
    with pytest.raises(GroupDropped) as info:
        registry.columns_for(_group(rows[0]))
    assert info.value.reason == "source_error" and "ZeroDivisionError" in info.value.detail
    assert registry.source_errors == 1 and "raised in rederive() on item flaky[0, 0]" in caplog.text
    with pytest.raises(SourceErrorLimit, match="raised 2 times in a row \\(limit 1\\)"):
        registry.columns_for(_group(rows[1]))


def test_a_source_whose_holds_raises_drops_the_group_as_a_source_error_and_long_details_are_cut(caplog):
    """A source's own `holds()` that raises on a sender's provenance (a user's source parsing a key it did not make)
    escaped into the training step; it drops the group as `source_error`, counted as one. And a drop's detail that
    quotes what a sender sent (a config of megabytes) is cut to `DETAIL_MAX_CHARS`."""
    from sapo.questions import DETAIL_MAX_CHARS

    class Picky(Flaky):
        def holds(self, provenance):
            raise ValueError(f"not a key of mine: {provenance.key}")  # a key this source did not make

    source = Picky()
    group = _group(source.rows(size=1)[0])
    group = Group(**{**vars(group), "provenance": dataclasses.replace(group.provenance, key="x" * 1000)})
    registry = SourceRegistry([source])
    with pytest.raises(GroupDropped) as info:
        registry.columns_for(group)
    assert info.value.reason == "source_error" and "in holds()" in info.value.detail
    assert registry.source_errors == 1 and not registry.costly(group)
    assert len(info.value.detail) <= DETAIL_MAX_CHARS and "characters in all" in info.value.detail
    assert max(len(record.getMessage()) for record in caplog.records) < 2 * DETAIL_MAX_CHARS


def test_a_received_group_of_a_held_out_question_is_dropped_and_the_others_verify():
    """A peer's held-out questions are what it is measured on: a received group of one (a peer with another split of
    the same data, or one naming the held-out seed of a generator) was trained on, every held-out row of the dataset,
    the generator and verifiers sources. Once the registry is told its questions (the trainer tells it those of its
    evaluation set), such a group is dropped as `held_out`, and the training items verify as before."""
    dataset = DatasetSource(RECORDS, "km", eval_fraction=0.25)
    generator = Flaky()
    registry = SourceRegistry([dataset, generator])
    held_rows = [*dataset.held_out(), *generator.held_out(4)]
    registry.hold_out(questions_of_rows([*held_rows]))
    rederived = []
    for source in (dataset, generator):
        own = source.rederive
        source.rederive = lambda provenance, question, own=own: rederived.append(question) or own(provenance, question)
    for row in held_rows:
        with pytest.raises(GroupDropped) as info:
            registry.columns_for(_group(row))
        assert info.value.reason == "held_out"
    assert rederived == []  # the sender's question is held out: nothing re-derived in vain
    held_questions = {row["prompt"][-1]["content"] for row in held_rows}
    trained = [
        row for row in [*dataset.rows(), *generator.rows(size=8)] if row["prompt"][-1]["content"] not in held_questions
    ]
    assert trained and all(registry.columns_for(_group(row))["answer"] == row["answer"] for row in trained)


def test_reward_columns_the_data_lacks_are_refused_with_the_columns_present():
    from sapo.reward_guard import check_reward_columns

    with pytest.raises(ValueError, match=r"reward column\(s\) unit not in the data; columns present: answer, "):
        DatasetSource(RECORDS, "km", columns=["unit"])

    def units_reward(prompts, completions, answer, unit, trainer_state=None, **kwargs):
        return [0.0 for _ in completions]

    rows = DatasetSource(RECORDS, "km").rows()
    lack = r"reward units_reward reads column\(s\) unit that the training rows lack; columns present: answer, entry, "
    with pytest.raises(ValueError, match=lack + "prompt, provenance, task, units"):
        check_reward_columns([units_reward], rows.column_names)
    check_reward_columns([units_reward], [*rows.column_names, "unit"])


def test_the_held_out_set_is_the_first_items_by_key_whatever_the_order():
    shuffled = RECORDS[:]
    random.Random(5).shuffle(shuffled)
    one, other = DatasetSource(RECORDS, "a", eval_fraction=0.5), DatasetSource(shuffled, "b", eval_fraction=0.5)
    keys = [json.loads(r["provenance"])["key"] for r in one.held_out(6)]
    assert keys == sorted(keys) == [json.loads(r["provenance"])["key"] for r in other.held_out(6)]


def test_conflicting_answers_are_warned_and_kept_out_of_the_held_out_set(caplog):
    conflicting = RECORDS + [{**r, "answer": r["answer"] + "0"} for r in RECORDS[:5]]
    source = DatasetSource(conflicting, "km", eval_fraction=0.5)
    assert source.conflicting_questions == 5
    assert "5 question(s) appear with different answers" in caplog.text and "How many metres are 1 km?" in caplog.text
    held = {r["prompt"][-1]["content"] for r in source.held_out()}
    assert held and not held & {r["question"] for r in RECORDS[:5]}
    assert len(source) + len(source.held_out()) == len(conflicting)  # set aside from evaluation, not from training


def test_a_library_user_sets_the_source_error_limit_with_the_sources_given_to_the_trainer(tiny_model_a, tmp_path):
    from sapo import SAPOConfig, SAPOTrainer
    from sapo.models import load_policy
    from swarm import MemorySwarm

    source = Flaky()
    model, tokenizer = load_policy(tiny_model_a)
    config = SAPOConfig(output_dir=str(tmp_path), num_local=1, num_external=1, num_generations=2,
                        per_device_train_batch_size=4, max_steps=1, use_cpu=True, report_to="none")  # fmt: skip
    limited = SourceRegistry([source], max_source_errors=3)
    trainer = SAPOTrainer(model, [lambda prompts, completions, **kw: [0.0] * len(completions)], config,
                          Dataset.from_list(source.rows(size=4)), processing_class=tokenizer,
                          swarm=MemorySwarm().join("a"), sources=limited)  # fmt: skip
    assert trainer.intake.sources.max_source_errors == 3 and trainer.intake.sources.sources[0] is source
    with pytest.raises(ValueError, match="max_source_errors must be >= 0 or None"):
        SourceRegistry([source], max_source_errors=-1)


def test_the_same_data_under_two_file_names_is_one_task_to_the_peer_that_takes_it(tiny_model_a, tmp_path):
    from sapo import SAPOConfig, SAPOTrainer
    from sapo.group_log import read_group_log
    from sapo.models import load_policy
    from swarm import MemorySwarm

    swarm = MemorySwarm(seed=0)
    trainers = {}
    for name in ("b", "a"):  # b publishes first; a takes b's groups
        source = DatasetSource(_write(tmp_path / f"{name}.jsonl", RECORDS), name)
        model, tokenizer = load_policy(tiny_model_a)
        config = SAPOConfig(output_dir=str(tmp_path / name), num_local=1, num_external=1, num_generations=2,
                            per_device_train_batch_size=4, max_completion_length=6, max_steps=1, use_cpu=True,
                            report_to="none", plausibility_margin=None, sampling_strategy="uniform",
                            groups_log="groups.jsonl")  # fmt: skip
        trainers[name] = SAPOTrainer(
            model, [lambda prompts, completions, **kw: [float(len(c[-1]["content"]) % 3) for c in completions]],
            config, source.rows(), processing_class=tokenizer, swarm=swarm.join(name), sources=[source],
        )  # fmt: skip
        trainers[name].train()
    received = [g for g in read_group_log(tmp_path / "a" / "groups.jsonl") if g["origin"] == "swarm"]
    assert any(g["outcome"] == "taken" for g in received), received
    assert {g["task"] for g in received} == {"a"}  # b's items, held here as a's: counted under this peer's name


def test_conflicting_answers_print_where_they_differ():
    from sapo.sources.dataset import where_they_differ

    reasoning = "Natalia sold 48 clips in April and half as many in May, so 48 + 24 = 72 clips.\n#### "
    assert where_they_differ([reasoning + "72", reasoning + "73"]) == ["...ps.\n#### 72", "...ps.\n#### 73"]
    assert where_they_differ(["4", "5"]) == ["4", "5"]
    long = ["x" * 100 + "a" * 40, "x" * 100 + "b" * 40]
    assert where_they_differ(long) == ["..." + "x" * 10 + "a" * 20 + "...", "..." + "x" * 10 + "b" * 20 + "..."]


def test_senders_take_turns_and_each_keeps_its_own_order():
    """The order in which a round re-derives its groups: every sender's first, then every one's second, and so on."""
    from sapo.sources import by_turns

    senders = ["a", "a", "a", "b", "c", "b", "a"]
    assert [senders[i] + str(i) for i in by_turns(senders)] == ["a0", "b3", "c4", "a1", "b5", "a2", "a6"]
    assert by_turns([]) == []
    # the senders found usable lately first, in turns among themselves
    first = [senders[i] + str(i) for i in by_turns(senders, first=lambda sender: sender == "c")]
    assert first == ["c4", "a0", "b3", "a1", "b5", "a2", "a6"]
