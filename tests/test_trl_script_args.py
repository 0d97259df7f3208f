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


def test_a_trl_grpo_config_on_a_local_dataset_runs_a_node(tmp_path, tiny_model_a):
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
    result = subprocess.run(
        [sys.executable, "-m", "sapo.node.cli", "--config", str(config), *tiny, "--status_port", "none"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    try:
        assert result.returncode == 0, result.stderr[-3000:]
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
