"""TRL's script and model arguments carry over with TRL's meaning: a `trl grpo`-style YAML (`model_name_or_path`,
`dataset_name` naming a local file, `dataset_train_split`, `use_peft` with `lora_r`, `reward_funcs`) runs a real
sapo-node, and every case TRL's names cannot mean here is refused at parse time with one line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from sapo.node.cli import main
from sapo.node.errors import NodeError
from sapo.node.options import config_yaml, parse_node_options
from tests.node_fixtures import TINY, _assert_gone, _metrics, _p2pd


def _jsonl(path: Path, count: int = 20) -> Path:
    path.write_text("".join(json.dumps({"question": f"What is {k} + {k}?", "answer": str(2 * k)}) + "\n"
                            for k in range(1, count + 1)))  # fmt: skip
    return path


def test_trl_names_take_trls_meaning(tmp_path):
    data = _jsonl(tmp_path / "doubling.jsonl")
    node = parse_node_options(
        ["--model_name_or_path", "some/model", "--dataset_name", str(data), "--use_peft", "true", "--lora_r", "8",
         "--lora_target_modules", "q_proj", "v_proj", "--reward_funcs", "math", "my_pkg.rewards.exact"]
    ).node  # fmt: skip
    assert (node.model, node.dataset, node.dataset_label, node.lora_r) == ("some/model", str(data), None, 8)
    assert node.lora_target_modules == ["q_proj", "v_proj"]
    assert node.rewards == ["math", "my_pkg.rewards:exact"]  # TRL's dotted import path, imported the same way
    assert parse_node_options(["--use_peft", "false", "--lora_r", "16"]).node.lora_r == 0  # every weight trained
    assert parse_node_options(["--lora_r", "4"]).node.lora_r == 4  # use_peft unset: lora_r decides, as before
    same = parse_node_options(["--model", "m", "--model_name_or_path", "m", "--dataset", str(data), "--dataset_name",
                               str(data), "--rewards", "math", "--reward_funcs", "math"]).node  # fmt: skip
    assert (same.model, same.dataset, same.rewards) == ("m", str(data), ["math"])


def test_dataset_name_beside_dataset_is_the_old_label_with_a_warning(tmp_path, caplog):
    data = _jsonl(tmp_path / "doubling.jsonl")
    with caplog.at_level(logging.WARNING, logger="sapo.node.arguments"):
        node = parse_node_options(["--dataset", str(data), "--dataset_name", "doubling"]).node
    assert (node.dataset, node.dataset_label) == (str(data), "doubling")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "deprecated" in warnings[0] and "--dataset_label doubling" in warnings[0]
    assert parse_node_options(["--dataset", str(data), "--dataset_label", "d"]).node.dataset_label == "d"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--dataset_name", "openai/gsm8k"], "--dataset_name openai/gsm8k: no such local file or folder; sapo-node "
                                             "loads only local data"),
        (["--dataset_name", "{data}", "--dataset_config", "main"], "--dataset_config main: a hub dataset's "
                                                                   "configuration"),
        (["--dataset_name", "{data}", "--dataset", "{other}"], "name two datasets; give one"),
        (["--dataset", "{data}", "--dataset_name", "a", "--dataset_label", "b"], "name the dataset twice"),
        (["--dataset_name", "{data}", "--dataset_train_split", "validation"], "is a file, which is the train split"),
        (["--model", "a", "--model_name_or_path", "b"], "--model a and --model_name_or_path b name two models"),
        (["--use_peft", "true", "--lora_r", "0"], "--use_peft true needs a positive --lora_r (got 0)"),
        (["--reward_funcs", "accuracy_reward"], "--reward_funcs accuracy_reward: TRL's own reward is not known here"),
        (["--reward_funcs", "nonsense"], "--reward_funcs nonsense: unknown reward"),
        (["--rewards", "math", "--reward_funcs", "format"], "name different rewards; give one"),
    ],
)  # fmt: skip
def test_what_trls_names_cannot_mean_here_is_refused_in_one_line(tmp_path, argv, expected):
    data, other = _jsonl(tmp_path / "a.jsonl"), _jsonl(tmp_path / "b.jsonl", 5)
    argv = [a.format(data=data, other=other) for a in argv]
    with pytest.raises(NodeError) as refused:
        parse_node_options(argv)
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_a_saved_dataset_dicts_splits_train_and_hold_out(tmp_path):
    from datasets import Dataset, DatasetDict

    from sapo.node.runner import build_questions

    rows = [{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(1, 31)]
    folder = tmp_path / "doubling"
    DatasetDict({"dev": Dataset.from_list(rows[:20]), "test": Dataset.from_list(rows[20:])}).save_to_disk(str(folder))
    node = parse_node_options(["--dataset_name", str(folder), "--dataset_train_split", "dev",
                               "--eval_fraction", "0"]).node  # fmt: skip
    dataset, [source] = build_questions(node, seed=0)
    assert len(dataset) == 20 and len(source.held_out()) == 10  # the test split held out, never trained on
    assert sorted(r["answer"] for r in source.held_out()) == sorted(r["answer"] for r in rows[20:])
    node = parse_node_options(["--dataset_name", str(folder)]).node
    with pytest.raises(
        NodeError, match=r"no split 'train' \(splits: dev, test\); choose one with --dataset_train_split"
    ):
        build_questions(node, seed=0)


def test_a_trl_style_config_prints_and_reads_back_the_same(tmp_path):
    data = _jsonl(tmp_path / "doubling.jsonl")
    config = tmp_path / "grpo.yaml"
    config.write_text(f"model_name_or_path: m\ndataset_name: {data}\nuse_peft: true\nlora_r: 8\nreward_funcs: [math]\n")
    printed = config_yaml(parse_node_options(["--config", str(config)]))
    (tmp_path / "again.yaml").write_text(printed)
    again = parse_node_options(["--config", str(tmp_path / "again.yaml")])
    assert (again.node.model, again.node.dataset, again.node.lora_r, again.node.rewards) == (
        "m",
        str(data),
        8,
        ["math"],
    )
    assert config_yaml(again) == printed


def test_a_trl_grpo_config_on_a_local_dataset_runs_a_node(tmp_path, tiny_model_a, capsys):
    data = _jsonl(tmp_path / "doubling.jsonl", 40)
    out = tmp_path / "run"
    config = tmp_path / "grpo.yaml"
    config.write_text(  # as a user writes one for `trl grpo --config grpo.yaml`
        f"model_name_or_path: {tiny_model_a}\n"
        f"dataset_name: {data}\n"
        "dataset_train_split: train\n"
        "use_peft: true\n"
        "lora_r: 8\n"
        "lora_alpha: 16\n"
        "lora_target_modules: [q_proj, v_proj]\n"
        "reward_funcs: [math]\n"
        "learning_rate: 1.0e-4\n"
        f"output_dir: {out}\n"
        "max_steps: 2\n"
        "save_steps: 2\n"
        "eval_strategy: 'no'\n"
        "eval_on_start: false\n"
    )
    tiny = [a for a in TINY if a not in ("--tasks", "basic_arithmetic")]  # the dataset replaces the tasks
    code = main(["--config", str(config), *tiny, "--status_port", "none"])  # in this process, as `sapo-node` runs it
    err = capsys.readouterr().err
    try:
        assert code == 0, err[-3000:]
        assert [m["step"] for m in _metrics(out)] == [1, 2]
        run = json.loads((out / "node-run.json").read_text())
        assert (run["model"], run["lora_r"], run["rewards"]) == (str(tiny_model_a), 8, ["math"])
        assert run["data"]["split"]["dataset_name"] is None  # the label, under the key earlier runs recorded
        assert run["data"]["sources"][0].startswith("dataset doubling ")
        adapter = json.loads((out / "final" / "adapter_config.json").read_text())
        assert adapter["r"] == 8 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    finally:
        _assert_gone(_p2pd(out))


def test_a_runs_recorded_label_keeps_its_key_so_earlier_runs_resume(tmp_path):
    from sapo.node.runner import build_questions, data_identity

    data = _jsonl(tmp_path / "doubling.jsonl")
    cases = [
        (["--dataset", str(data), "--dataset_name", "km"], "km"),  # as earlier runs recorded it
        (["--dataset", str(data), "--dataset_label", "km"], "km"),
        (["--dataset_name", str(data)], None),
    ]
    for argv, label in cases:
        node = parse_node_options(argv).node
        dataset, sources = build_questions(node, seed=0)
        assert data_identity(node, dataset, sources)["split"]["dataset_name"] == label


TRL_REWARDS = '''
def accuracy(completions, solution, **kwargs):
    """TRL's convention: the reference answer in the `solution` column."""
    return [float(s in c[-1]["content"]) for c, s in zip(completions, solution)]
'''


def _trl_folder(folder: Path) -> Path:
    """A dataset in TRL's local form: a folder of train.jsonl and test.jsonl, conversational `prompt`, `solution`."""
    folder.mkdir()
    for split, numbers in (("train", range(1, 31)), ("test", range(31, 37))):
        rows = [{"prompt": [{"role": "user", "content": f"What is {k} + {k}?"}], "solution": str(2 * k)}
                for k in numbers]  # fmt: skip
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_yaml_in_trls_example_form_runs_unchanged(tmp_path, tiny_model_a):
    data = _trl_folder(tmp_path / "doubling")
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    out = tmp_path / "run"
    config = tmp_path / "grpo.yaml"
    config.write_text(  # TRL's example form: ModelConfig, ScriptArguments and GRPOConfig keys in one file
        "# Model arguments\n"
        f"model_name_or_path: {tiny_model_a}\n"
        "model_revision: main\n"
        "dtype: bfloat16\n"
        "attn_implementation: flash_attention_2\n"
        "use_peft: true\n"
        "lora_r: 8\n"
        "lora_alpha: 16\n"
        "lora_dropout: 0.05\n"
        "lora_target_modules: [q_proj, v_proj]\n"
        "lora_task_type: CAUSAL_LM\n"
        "# Script arguments\n"
        f"dataset_name: {data}\n"
        "dataset_train_split: train\n"
        "dataset_test_split: test\n"
        "reward_funcs:\n"
        "  - trl_rewards.accuracy\n"
        "# GRPO trainer config\n"
        f"output_dir: {out}\n"
        "learning_rate: 1.0e-5\n"
        "lr_scheduler_type: cosine\n"
        "max_steps: 1\n"
        "per_device_train_batch_size: 4\n"
        "num_generations: 2\n"
        "max_completion_length: 8\n"
        "logging_steps: 1\n"
        "save_strategy: steps\n"
        "save_steps: 1\n"
        "report_to: none\n"
        "seed: 42\n"
    )
    tiny = [a for a in TINY if a not in ("--tasks", "basic_arithmetic")]
    # One step, evaluated once (at the end): every key of the YAML takes effect in the first step.
    # As the `sapo-node` script runs (no working directory on sys.path: `-P`), from the folder `trl grpo` would run in.
    result = subprocess.run(
        [sys.executable, "-P", "-m", "sapo.node.cli", "--config", str(config), *tiny, "--eval_questions", "4",
         "--eval_on_start", "false", "--status_port", "none"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        assert [m["step"] for m in _metrics(out)] == [1]
        run = json.loads((out / "node-run.json").read_text())
        assert run["rewards"] == ["trl_rewards:accuracy"] and "solution" in run["data"]["columns"]
        assert run["data"]["sources"][0].startswith("dataset doubling ")
        held_out = [json.loads(line) for line in (out / "held_out.jsonl").read_text().splitlines()]
        assert held_out and all(q["task"] == "doubling" for q in held_out[0]["questions"])
        log = (out / "node.log").read_text()
        assert "questions: dataset doubling 1 (36 items)" in log  # both files read: test.jsonl held out
        assert "--attn_implementation flash_attention_2 is not available here" in log or "flash" not in log
    finally:
        _assert_gone(_p2pd(out))


def test_trls_prompt_and_solution_columns_are_the_question_and_the_answer(tmp_path):
    from sapo.node.runner import build_questions

    rows = [{"prompt": f"What is {k} + {k}?", "solution": str(2 * k)} for k in range(1, 21)]
    data = tmp_path / "plain.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset, [source] = build_questions(parse_node_options(["--dataset", str(data), "--eval_fraction", "0"]).node, 0)
    first = dataset[0]
    assert first["prompt"][-1] == {"role": "user", "content": "What is 1 + 1?"}  # a string prompt: the question
    assert (first["answer"], first["solution"]) == ("2", "2")  # the answer, and TRL's column under its own name
    named = parse_node_options(["--dataset", str(data), "--answer_column", "solution", "--eval_fraction", "0"]).node
    assert build_questions(named, 0)[0][0]["solution"] == "2"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("lora_task_type: SEQ_CLS", "--lora_task_type SEQ_CLS: a policy is a causal LM; use CAUSAL_LM"),
        ("load_in_4bit: true", "--load_in_4bit true: not supported by sapo-node: leave it out"),
        ("use_dora: true", "--use_dora true: not supported by sapo-node: leave it out"),
        ("reward_model_name_or_path: some/rm", "--reward_model_name_or_path some/rm: not supported by sapo-node"),
        ("dtype: float64", "--dtype float64: invalid choice; use one of auto, bfloat16, float16, float32"),
    ],
)
def test_what_trls_model_arguments_ask_and_a_node_does_not_do_is_refused_in_one_line(tmp_path, key, expected):
    config = tmp_path / "grpo.yaml"
    config.write_text(f"model_name_or_path: m\n{key}\n")
    with pytest.raises(NodeError) as refused:
        parse_node_options(["--config", str(config)])
    assert expected in str(refused.value) and "\n" not in str(refused.value)
