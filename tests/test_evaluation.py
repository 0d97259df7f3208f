"""Held-out evaluation: questions disjoint from training, its figures, the trainer's schedule, `sapo-node eval`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from transformers import TrainerCallback

from benchmarks.held_out_table import outcomes_by_step
from rewards import reasoning_gym_reward
from sapo import SAPOConfig, SAPOTrainer
from sapo.evaluation import (
    HeldOutResult,
    QuestionResult,
    correctness_scores,
    evaluate_policy,
    item_key_of,
    paired_difference,
)
from sapo.jsonl_files import read_jsonl
from sapo.models import load_policy
from sapo.node.callbacks import EvaluateAtEnd, MetricsJsonl
from sapo.node.cli import main
from sapo.tasks import (
    DEFAULT_TASKS,
    HELD_OUT_SEED_BASE,
    TaskSpec,
    build_held_out_dataset,
    build_reasoning_gym_dataset,
)
from swarm import MemorySwarm


def _generator_seeds(dataset) -> list[int]:
    """reasoning-gym draws entry i of a generator with seed s from Random(s + i)."""
    return [p["seed"] + p["index"] for p in map(json.loads, dataset["provenance"])]


def test_held_out_questions_never_share_a_generator_seed_with_training():
    held_out = build_held_out_dataset(DEFAULT_TASKS, size=200)
    for seed in (0, 1, 2**31 - 1):
        training = build_reasoning_gym_dataset(DEFAULT_TASKS, size=300, seed=seed)
        assert max(_generator_seeds(training)) < HELD_OUT_SEED_BASE
    assert HELD_OUT_SEED_BASE <= min(_generator_seeds(held_out)) and max(_generator_seeds(held_out)) < 2**32
    with pytest.raises(ValueError, match="size must be between"):
        build_reasoning_gym_dataset(DEFAULT_TASKS, size=2**30 + 1)  # would reach the held-out band


def test_held_out_question_texts_are_new_where_the_question_space_is_large():
    task = [TaskSpec("basic_arithmetic", {"min_digits": 2, "max_digits": 3, "min_terms": 3, "max_terms": 4})]
    trained = {p[-1]["content"] for seed in (0, 1) for p in build_reasoning_gym_dataset(task, 500, seed)["prompt"]}
    held_out = [p[-1]["content"] for p in build_held_out_dataset(task, 100)["prompt"]]
    assert len(set(held_out)) == 100 and not trained & set(held_out)


def test_every_peer_gets_the_same_held_out_set_and_tasks_take_turns():
    small = build_held_out_dataset(DEFAULT_TASKS, size=8)
    reordered = build_held_out_dataset(list(reversed(DEFAULT_TASKS)), size=12)
    assert reordered.select(range(8))["prompt"] == small["prompt"]  # order-free, and a larger set extends it
    assert small["task"] == sorted(t.name for t in DEFAULT_TASKS) * 2


def _result(task_outcomes: list[tuple[str, float]]) -> HeldOutResult:
    return HeldOutResult([QuestionResult(t, i, s, "", 3) for i, (t, s) in enumerate(task_outcomes)])


def test_pass_at_1_counts_full_marks_only_and_gives_standard_errors():
    result = _result([("a", 1.0), ("a", 0.0), ("a", 1.0), ("b", 0.5), ("b", 0.0)])
    assert result.pass_at_1() == pytest.approx(0.4) and result.pass_at_1("b") == 0.0
    assert result.standard_error() == pytest.approx(math.sqrt(0.3 / 5))  # sample variance 0.3, n = 5
    metrics = result.metrics()
    assert metrics["eval/pass@1/a"] == pytest.approx(2 / 3) and metrics["eval/questions"] == 5
    assert "all" in result.table() and HeldOutResult.from_json(result.to_json()) == result


def test_paired_difference_compares_the_same_questions():
    before = _result([("a", 0.0), ("a", 0.0), ("a", 1.0), ("a", 0.0)])
    after = _result([("a", 1.0), ("a", 1.0), ("a", 1.0), ("a", 0.0)])
    mean, se = paired_difference(before, after)
    assert mean == pytest.approx(0.5) and se == pytest.approx(math.sqrt(1 / 3 / 4))
    with pytest.raises(ValueError, match="same held-out questions"):
        paired_difference(before, _result([("b", 1.0)] * 4))


def test_correctness_uses_the_task_scorer_and_the_answer_column():
    rows = [dict(row) for row in build_held_out_dataset([TaskSpec("basic_arithmetic")], size=2)]
    rows.append({"prompt": [{"role": "user", "content": "1/2?"}], "entry": "", "answer": "0.5"})
    right = [f"<answer>{rows[0]['answer']}</answer>", "no idea", "<answer>1/2</answer>"]
    assert correctness_scores(right, rows) == [1.0, 0.0, 1.0]


def _args(tmp_path, **overrides) -> SAPOConfig:
    base = dict(
        output_dir=str(tmp_path / "out"), num_local=1, num_external=1, num_generations=2,
        per_device_train_batch_size=4, max_completion_length=6, max_steps=3, learning_rate=1e-2, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, seed=3, disable_tqdm=True, eval_strategy="steps",
        eval_steps=2, eval_on_start=True, eval_questions=8, per_device_eval_batch_size=8,
    )  # fmt: skip
    base.update(overrides)
    return SAPOConfig(**base)


class SwarmCalls(TrainerCallback):
    """Counts the swarm's fetch and publish calls between the trainer's evaluation start and end."""

    def __init__(self, swarm):
        self.swarm, self.during_evaluation = swarm, []
        fetch, publish = swarm.fetch, swarm.publish
        self.calls = []
        swarm.fetch = lambda *a, **k: (self.calls.append("fetch"), fetch(*a, **k))[1]
        swarm.publish = lambda *a, **k: (self.calls.append("publish"), publish(*a, **k))[1]

    def on_phase(self, phase, state):
        if phase == "evaluating":
            self.mark = len(self.calls)

    def on_evaluate(self, args, state, control, **kwargs):
        self.during_evaluation.extend(self.calls[self.mark :])


def test_trainer_evaluates_held_out_at_start_on_schedule_and_at_the_end_without_the_swarm(
    tmp_path, tiny_model_a, monkeypatch
):
    from sapo import held_out

    monkeypatch.setattr(held_out, "HELD_OUT_LOG_MAX_BYTES", 1)  # every evaluation's line rotates the one before
    model, tokenizer = load_policy(tiny_model_a)
    swarm = MemorySwarm().join("peer-a")
    spy = SwarmCalls(swarm)
    dataset = build_reasoning_gym_dataset(DEFAULT_TASKS[:2], size=32, seed=0)
    trainer = SAPOTrainer(
        model=model, reward_funcs=[reasoning_gym_reward], args=_args(tmp_path, held_out_log="held_out.jsonl"),
        train_dataset=dataset, processing_class=tokenizer, swarm=swarm, callbacks=[spy, EvaluateAtEnd()],
    )  # fmt: skip
    trainer.train()
    evaluations = [h for h in trainer.state.log_history if "eval/pass@1" in h]
    assert [h["step"] for h in evaluations] == [0, 2, 3]  # start, eval_steps, last step
    # Question by question, as logged (rotated: `.2` and `.1` hold the older lines, read first): the same questions at
    # every step, pass@1 their mean.
    log = tmp_path / "out" / "held_out.jsonl"
    assert [len(Path(f"{log}{end}").read_text().splitlines()) for end in (".2", ".1", "")] == [1, 1, 1]
    lines = list(read_jsonl(log))
    assert [line["step"] for line in lines] == [0, 2, 3] and sorted(outcomes_by_step(log)) == [0, 2, 3]
    for line, logged in zip(lines, evaluations, strict=True):
        assert [(q["task"], q["index"]) for q in line["questions"]] == [
            (q["task"], q["index"]) for q in lines[0]["questions"]
        ]
        assert sum(q["correct"] for q in line["questions"]) / 8 == pytest.approx(logged["eval/pass@1"])
    assert all(not any(k.startswith(("loss", "reward", "sapo/")) for k in h) for h in evaluations)
    assert evaluations[0]["eval/questions"] == 8 and "eval/pass@1/base_conversion" in evaluations[0]
    assert trainer.eval_dataset["prompt"] == build_held_out_dataset(DEFAULT_TASKS[:2], size=8)["prompt"]
    assert "publish" in spy.calls and spy.during_evaluation == []  # trained with the swarm, evaluated without


def test_a_task_specialist_is_evaluated_on_the_tasks_it_is_given(tmp_path, tiny_model_a):
    model, tokenizer = load_policy(tiny_model_a)
    specialist = build_reasoning_gym_dataset(DEFAULT_TASKS[:1], size=16, seed=0)  # trains on one task
    trainer = SAPOTrainer(
        model=model, reward_funcs=[reasoning_gym_reward], args=_args(tmp_path), train_dataset=specialist,
        processing_class=tokenizer, held_out_tasks=DEFAULT_TASKS[:2],
    )  # fmt: skip
    assert trainer.eval_dataset["prompt"] == build_held_out_dataset(DEFAULT_TASKS[:2], size=8)["prompt"]


def test_greedy_evaluation_is_deterministic_and_restores_training_mode(tiny_model_a):
    model, tokenizer = load_policy(tiny_model_a)
    model.train()
    questions = build_held_out_dataset(DEFAULT_TASKS, size=6)
    first = evaluate_policy(model, tokenizer, questions, max_new_tokens=5, batch_size=4)
    second = evaluate_policy(model, tokenizer, questions, max_new_tokens=5, batch_size=3)
    assert [q.completion for q in first.questions] == [q.completion for q in second.questions]
    assert model.training and tokenizer.padding_side == "right"


def test_evaluation_off_builds_no_held_out_set_and_logs_none(tmp_path, tiny_model_a):
    model, tokenizer = load_policy(tiny_model_a)
    dataset = build_reasoning_gym_dataset(DEFAULT_TASKS[:1], size=16, seed=0)
    args = _args(tmp_path, eval_strategy="no", num_local=2, num_external=0, max_steps=1)
    trainer = SAPOTrainer(model=model, reward_funcs=[reasoning_gym_reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer)  # fmt: skip
    trainer.train()
    assert trainer.eval_dataset is None
    assert not any(k.startswith("eval/") for h in trainer.state.log_history for k in h)


def test_evaluation_of_a_non_procedural_dataset_needs_an_eval_dataset(tmp_path, tiny_model_a):
    from datasets import Dataset

    model, tokenizer = load_policy(tiny_model_a)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i}?"}], "answer": str(2 * i)}
                                 for i in range(8)])  # fmt: skip
    with pytest.raises(ValueError, match="eval_dataset"):
        SAPOTrainer(model=model, reward_funcs=[reasoning_gym_reward], args=_args(tmp_path, num_local=2, num_external=0),
                    train_dataset=dataset, processing_class=tokenizer)  # fmt: skip


def test_a_restart_keeps_its_resume_steps_evaluation_and_knows_it_is_done(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 1, "loss": 0.1}, {"step": 2, "loss": 0.1}, {"step": 2, "eval/pass@1": 0.5}, {"step": 3}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    metrics = MetricsJsonl(path, resume_step=2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == lines[:3]
    assert metrics.evaluated(2) and not metrics.evaluated(1)  # the node does not evaluate step 2 again
    assert not MetricsJsonl(path, resume_step=1).evaluated(1) and len(path.read_text().splitlines()) == 1


def test_sapo_node_eval_prints_a_per_task_table_for_a_model_and_a_lora_adapter(tmp_path, tiny_model_a, capsys):
    from peft import get_peft_model

    from sapo.models import LoraSpec, lora_config

    out = tmp_path / "eval.json"
    argv = ["--tasks", "basic_arithmetic", "base_conversion", "--questions", "4", "--max-new-tokens", "4"]
    assert main(["eval", str(tiny_model_a), *argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "basic_arithmetic" in printed and "base_conversion" in printed and "all" in printed
    assert len(json.loads(out.read_text())["questions"]) == 4

    model, tokenizer = load_policy(tiny_model_a)
    adapter = tmp_path / "adapter"
    get_peft_model(model, lora_config(LoraSpec(r=2))).save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    assert main(["eval", str(adapter), *argv]) == 0
    assert "all" in capsys.readouterr().out


def test_sapo_node_eval_names_what_is_wrong(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["eval", "default", "--tasks", "basic_arithmetik"]) == 2
    assert "basic_arithmetic" in capsys.readouterr().err  # the close match is suggested
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/nowhere/llama-7b"}))
    assert main(["eval", str(adapter)]) == 2
    assert "--base" in capsys.readouterr().err


def test_local_swarm_status_line_says_what_each_node_is_doing(tmp_path):
    from sapo.node.local_swarm import status_line
    from sapo.node.status import write_status

    (tmp_path / "node-0").mkdir()
    (tmp_path / "node-1").mkdir()
    write_status(tmp_path / "node-0", "loading model", 0)
    write_status(tmp_path / "node-1", "generating", 3)
    (tmp_path / "node-1" / "metrics.jsonl").write_text(
        json.dumps({"step": 2, "sapo/local_reward": 0.25, "sapo/peers": 1}) + "\n"
        + json.dumps({"step": 2, "eval/pass@1": 0.4}) + "\n"
    )  # fmt: skip
    line = status_line(tmp_path, 3)
    assert "node-0: loading model" in line and "node-2: starting (loading libraries)" in line
    assert "node-1: step 3 generating (reward 0.250, held-out 0.400, taken 0 peers 1)" in line


def test_a_given_eval_set_gets_trl_s_evaluation_with_pass_at_1_added_on_reasoning_gym_rows(
    tmp_path, tiny_model_a, caplog
):
    import logging

    from datasets import Dataset

    from sapo.node.callbacks import NodeStatus

    model, tokenizer = load_policy(tiny_model_a)
    dataset = build_reasoning_gym_dataset(DEFAULT_TASKS[:1], size=16, seed=0)
    held_out = build_held_out_dataset(DEFAULT_TASKS[:1], size=4)
    args = _args(tmp_path, num_local=2, num_external=0, max_steps=1, per_device_eval_batch_size=4)

    def brevity(prompts, completions, **columns):  # applies to any row, plain or chat
        return [1.0 / (1 + len(c if isinstance(c, str) else c[0]["content"])) for c in completions]

    trainer = SAPOTrainer(model=model, reward_funcs=[brevity], args=args, train_dataset=dataset, eval_dataset=held_out,
                          processing_class=tokenizer, callbacks=[NodeStatus(tmp_path)])  # fmt: skip
    with caplog.at_level(logging.INFO, logger="sapo"):
        metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_loss"]) and "eval_reward" in metrics  # TRL's figures
    assert metrics["eval/questions"] == 4 and 0.0 <= metrics["eval/pass@1"] <= 1.0  # added, in the same line
    (line,) = [h for h in trainer.state.log_history if "eval/pass@1" in h]
    assert "eval_loss" in line and trainer.last_evaluation is not None
    assert any("held-out pass@1" in r.getMessage() and "on 4 questions" in r.getMessage() for r in caplog.records)
    plain = Dataset.from_list([{"prompt": "Once upon a time"}, {"prompt": "The answer is"}])
    metrics = trainer.evaluate(plain, metric_key_prefix="plain")
    assert math.isfinite(metrics["plain_loss"]) and not any("pass@1" in key for key in metrics)


def test_peers_holding_a_file_in_different_orders_log_the_same_held_out_items_by_key(tmp_path, tiny_model_a):
    from sapo.sources import DatasetSource

    records = [{"question": f"How many metres are {k} km?", "answer": str(1000 * k)} for k in range(1, 41)]
    logged = []
    for name, order in (("in-order", records), ("reversed", records[::-1])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in order))
        source = DatasetSource(str(path), name="km", eval_fraction=0.25)
        model, tokenizer = load_policy(tiny_model_a)
        args = _args(
            tmp_path / name,
            num_external=0,
            per_device_train_batch_size=2,
            eval_questions=6,
            held_out_log="held_out.jsonl",
        )
        trainer = SAPOTrainer(model=model, reward_funcs=[reasoning_gym_reward], args=args,
                              train_dataset=source.rows(), processing_class=tokenizer, sources=[source])  # fmt: skip
        trainer.evaluate()
        line = json.loads((tmp_path / name / "out" / "held_out.jsonl").read_text().splitlines()[-1])
        by_key = {json.loads(r["provenance"])["key"]: r["prompt"][-1]["content"] for r in source.held_out(6)}
        assert [q["key"] for q in line["questions"]] == list(by_key)  # every question logged with its item's key
        logged.append(by_key)
    assert logged[0] == logged[1]  # the same keys, each naming the same question, on both peers
    held_out = build_held_out_dataset(DEFAULT_TASKS[:1], size=2)
    keys = [item_key_of(row) for row in held_out]
    assert all(k and k.startswith(f"reasoning_gym/{DEFAULT_TASKS[0].name}/") for k in keys) and len(set(keys)) == 2


def test_the_nodes_in_memory_log_keeps_its_last_entries_once_they_are_in_metrics_jsonl(tmp_path, monkeypatch):
    """The trainer keeps every logged step in memory and in each checkpoint (6-8 KB a step with the swarm's figures:
    1.5-2 GB after a month at 10 s a step); the node's file holds them all, so memory keeps the last few."""
    from transformers import TrainerState

    from sapo.node import callbacks

    monkeypatch.setattr(callbacks, "LOG_HISTORY_KEPT", 5)
    metrics = MetricsJsonl(tmp_path / "metrics.jsonl")
    state = TrainerState()
    for step in range(1, 13):
        state.global_step = step
        logs = {"loss": float(step)}
        state.log_history.append({**logs, "step": step})  # as Trainer.log does before its callbacks
        metrics.on_log(None, state, None, logs=logs)
    assert [entry["step"] for entry in state.log_history] == [8, 9, 10, 11, 12]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 13))


def test_metrics_jsonl_is_rotated_by_size_and_a_resume_drops_later_steps_from_every_file(tmp_path):
    """A node left running holds at most a few sizes of its metrics file on disk (rotated: `.1` the newest older one,
    the oldest deleted); a restart from a checkpoint drops the lines past its step from the rotated files too, holds
    only the last lines in memory, and `sapo-node report` reads the rotated files before the file itself."""
    from transformers import TrainerState

    from sapo.node.report import load_runs

    path = tmp_path / "metrics.jsonl"
    # the longest line the node writes here: its time with all 17 digits (a shorter repr makes a line a few bytes
    # shorter, never short enough for a fourth line to fit)
    line_bytes = len(json.dumps({"step": 10, "time": 1764561234.1234567, "loss": 1.0})) + 1
    metrics = MetricsJsonl(path, max_bytes=3 * line_bytes + 2, backups=2)  # three lines a file
    state = TrainerState()
    for step in range(1, 13):
        state.global_step = step
        metrics.on_log(None, state, None, logs={"loss": 1.0})
    steps = {f.name: [json.loads(line)["step"] for line in f.read_text().splitlines()] for f in tmp_path.iterdir()}
    # 12 lines, three a file: the oldest file (steps 1-3) deleted, two rotated ones kept
    assert steps == {"metrics.jsonl.2": [4, 5, 6], "metrics.jsonl.1": [7, 8, 9], "metrics.jsonl": [10, 11, 12]}
    assert [r["step"] for r in load_runs(tmp_path)[tmp_path.name]] == list(range(4, 13))

    metrics.on_log(None, state, None, logs={"eval/pass@1": 0.5})  # step 12's evaluation, rotating again
    resumed = MetricsJsonl(path, resume_step=8, max_bytes=3 * line_bytes + 2, backups=2)
    assert [r["step"] for r in load_runs(tmp_path)[tmp_path.name]] == [7, 8]  # 9 and after gone from `.1` and `.2`
    assert not resumed.evaluated(12) and [r["step"] for r in resumed.history] == [7, 8]


def test_a_restarted_node_holds_only_the_last_lines_of_a_long_metrics_file(tmp_path, monkeypatch):
    from sapo.node import callbacks

    monkeypatch.setattr(callbacks, "HISTORY_KEPT", 4)
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": step, "loss": 1.0} for step in range(1, 21)] + [{"step": 20, "eval/pass@1": 0.25}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    metrics = MetricsJsonl(path, resume_step=20)
    assert [r["step"] for r in metrics.history] == [18, 19, 20, 20] and metrics.evaluated(20)
    assert len(path.read_text().splitlines()) == 21  # nothing past the step: the file is left as it was


def test_a_trainer_never_trains_on_a_received_group_of_a_question_it_evaluates_on(tmp_path, tiny_model_a):
    """The trainer tells its task sources the questions of its evaluation set: a swarm group of one of them (a peer
    with another split of the same data) is dropped as `held_out` by the trainer's own intake, and a group of a
    training question is verified. Before, every held-out item a peer sent was trained on."""
    from sapo.publication import published_prompt
    from sapo.questions import GroupDropped
    from sapo.sources import DatasetSource
    from swarm.records import Group, provenance_from_wire, validate_group

    records = [{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(40)]
    questions = DatasetSource(records, name="sums", eval_fraction=0.25)
    model, tokenizer = load_policy(tiny_model_a)
    trainer = SAPOTrainer(
        model=model, reward_funcs=[reasoning_gym_reward], args=_args(tmp_path, eval_questions=10),
        train_dataset=questions.rows(), processing_class=tokenizer, swarm=MemorySwarm().join("peer-a"),
        sources=[questions],
    )  # fmt: skip

    def received(row):
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        return validate_group(Group("0-0", published_prompt(row["prompt"]), ["1", "2"], provenance))

    evaluated, trained = trainer.eval_dataset[0], questions.rows()[0]
    with pytest.raises(GroupDropped) as info:
        trainer.intake.sources.columns_for(received(evaluated))
    assert info.value.reason == "held_out"
    assert len(trainer.intake.sources.held_out_questions) == len(trainer.eval_dataset) == 10
    assert trainer.intake.sources.columns_for(received(trained))["answer"] == trained["answer"]
