"""benchmarks/strong_peer.py and sapo_table's cpu-hard-strong profile: a LoRA adapter merged into a model folder a
node loads, the students and the stronger peers of a swarm each given their model, a run's identity holding the
stronger model's digest, and the profile end to end on tiny models (real local swarm)."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest

from tests.node_fixtures import STARTER  # noqa: F401 (local swarms and their nodes fork from the worker's warm server)

CHECK = ["--new-tokens", "4"]
"""The merge check's greedy answers: 4 tokens each (24 by default) show that the merged model generates."""


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.sapo_table")


@pytest.fixture(scope="module")
def strong_peer():
    return importlib.import_module("benchmarks.strong_peer")


@pytest.fixture(scope="module")
def adapter(tiny_model_a, tmp_path_factory) -> Path:
    """A LoRA adapter on tiny model A that changes its outputs (B is zero at initialisation: set it), saved as a node
    saves its final/ folder (adapter with the tokenizer)."""
    import torch

    from sapo.models import LoraSpec, load_policy

    model, tokenizer = load_policy(tiny_model_a, lora=LoraSpec(r=4, alpha=8, dropout=0.0))
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    folder = tmp_path_factory.mktemp("adapter") / "final"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def strong_model(strong_peer, adapter, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("strong") / "model"
    strong_peer.main(["--adapter", str(adapter), "--out", str(out), *CHECK])
    return out


def _config(bench, tmp_path: Path, strong: Path, *extra: str) -> dict:
    argv = ["--profile", "cpu-hard-strong", "--strong-model", str(strong), "--runs-dir", str(tmp_path / "runs"),
            "--results-dir", str(tmp_path / "results"), "--allow-dirty", *extra]  # fmt: skip
    return bench.build_config(*bench.parse_args(argv))


# ----------------------------------------------------------------------------------------------------
# the model folder


def test_the_merged_folder_loads_as_a_node_model_with_the_adapters_policy(strong_peer, adapter, strong_model):
    import torch

    from sapo.models import load_policy, load_trained_policy

    merged, tokenizer = load_policy(strong_model)  # what sapo-node --model DIR runs
    assert not hasattr(merged, "peft_config")  # a plain model: the node trains its own LoRA on top
    reference, _ = load_trained_policy(adapter)  # the adapter on the base its config names
    base, _ = load_policy(json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"])
    ids = tokenizer("What is 12 + 30?", return_tensors="pt")
    with torch.no_grad():
        logits = merged(**ids).logits
        assert torch.allclose(logits, reference(**ids).logits, atol=1e-4)
        assert (logits - base(**ids).logits).abs().max() > 1e-2  # the adapter is in the weights

    record = json.loads((strong_model / strong_peer.RECORD).read_text())
    assert record["digest"] == strong_peer.model_digest(strong_model)
    assert record["lora_r"] == 4 and record["check"]["max_logit_difference"] <= 1e-3
    assert record["check"]["max_logit_change_from_base"] > 1e-2
    assert all(answer["tokens"] > 0 for answer in record["check"]["answers"])


def test_bad_input_is_refused_with_what_to_pass(strong_peer, adapter, strong_model, tmp_path):
    with pytest.raises(SystemExit, match="not empty"):
        strong_peer.main(["--adapter", str(adapter), "--out", str(strong_model)])
    with pytest.raises(SystemExit, match="no adapter_config.json"):
        strong_peer.main(["--adapter", str(strong_model), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="no config.json"):
        strong_peer.model_digest(adapter)


def _trained_node(folder: Path, adapter: Path, correct_at_0: int, correct_at_300: int, questions: int = 64) -> Path:
    """A node's output folder as a trained run leaves it: final/ (the adapter) and held_out.jsonl at steps 0 and 300,
    the first ``correct_at_*`` questions answered right; its tokenizer pads on the left, as a trained node's does."""
    from transformers import AutoTokenizer

    shutil.copytree(adapter, folder / "final")
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(folder / "final")
    lines = []
    for step, correct in ((0, correct_at_0), (300, correct_at_300)):
        rows = [{"task": "basic_arithmetic", "index": i, "correct": i < correct, "score": float(i < correct)}
                for i in range(questions)]  # fmt: skip
        lines.append(json.dumps({"step": step, "eval": "eval", "questions": rows}))
    (folder / "held_out.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_a_trained_node_becomes_a_stronger_peer_only_past_its_preregistered_test(strong_peer, adapter, tmp_path):
    learned = _trained_node(tmp_path / "run" / "node-0", adapter, correct_at_0=8, correct_at_300=24)
    (learned / "metrics.jsonl").write_text('{"step": 300, "loss": 0.1}\n')
    (learned.parent / "run-complete.json").write_text("{}\n")
    out, kept = tmp_path / "model", tmp_path / "archive"
    record = strong_peer.main(["--run", str(learned), "--out", str(out), "--archive", str(kept), *CHECK])
    test = record["qualification"]
    assert test["stronger"] and test["step"] == 300 and test["questions"] == 64
    assert test["pass_at_1"] == {"0": 8 / 64, "300": 24 / 64}
    assert test["change"]["value"] == pytest.approx(16 / 64) and test["change"]["ci_low"] > 0
    assert json.loads((out / strong_peer.RECORD).read_text())["qualification"] == test
    # what the results keep: the run's small files, the adapter (not the merged model), the record
    assert (kept / "run" / "node-0" / "held_out.jsonl").read_text() == (learned / "held_out.jsonl").read_text()
    assert (kept / "run" / "run-complete.json").exists() and (kept / "run" / "node-0" / "metrics.jsonl").exists()
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {
        p.name for p in (kept / "adapter").iterdir()
    }
    assert json.loads((kept / strong_peer.RECORD).read_text())["digest"] == record["digest"]
    # the archive alone makes the same model folder, byte for byte
    again = strong_peer.main(["--adapter", str(kept / "adapter"), "--out", str(tmp_path / "again"), *CHECK])
    assert again["digest"] == record["digest"]

    # a gain inside its interval (two more right of 64) is not a stronger peer: refused, nothing written
    flat = _trained_node(tmp_path / "flat", adapter, correct_at_0=8, correct_at_300=10)
    with pytest.raises(SystemExit, match="not a stronger peer.*0.125 at step 0, 0.156 at step 300"):
        strong_peer.main(["--run", str(flat), "--out", str(tmp_path / "flat-model")])
    assert not (tmp_path / "flat-model").exists()


def test_a_node_without_both_evaluations_is_refused_with_what_it_lacks(strong_peer, adapter, tmp_path, capsys):
    node = _trained_node(tmp_path / "node", adapter, correct_at_0=8, correct_at_300=24)
    with pytest.raises(SystemExit):
        strong_peer.parse_args(["--out", str(tmp_path / "x")])
    assert "one of the arguments --run --adapter is required" in capsys.readouterr().err
    (node / "held_out.jsonl").write_text((node / "held_out.jsonl").read_text().splitlines()[1] + "\n")
    with pytest.raises(SystemExit, match=r"evaluates steps \[300\]; the test needs step 0"):
        strong_peer.main(["--run", str(node), "--out", str(tmp_path / "out")])
    (node / "held_out.jsonl").unlink()
    with pytest.raises(SystemExit, match="no held_out.jsonl"):
        strong_peer.main(["--run", str(node), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="--archive keeps a trained run's files: pass the node's folder with --run"):
        strong_peer.main(["--adapter", str(adapter), "--out", str(tmp_path / "out"), "--archive", str(tmp_path)])


def test_the_digest_follows_the_contents_not_the_place(strong_peer, strong_model, tmp_path):
    copy = shutil.copytree(strong_model, tmp_path / "elsewhere")
    assert strong_peer.model_digest(copy) == strong_peer.model_digest(strong_model)
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("}", ', "extra": 1}', 1))
    assert strong_peer.model_digest(copy) != strong_peer.model_digest(strong_model)


# ----------------------------------------------------------------------------------------------------
# the profile


def test_students_and_stronger_peers_each_get_their_model_and_the_whole_mix(bench, strong_model, tmp_path):
    from sapo.node.local_swarm import node_command
    from sapo.node.options import parse_node_args

    config = _config(bench, tmp_path, strong_model)
    assert (config["peers"], config["groups_per_step"], config["steps"], config["seeds"]) == (4, 4, 60, [0, 1, 2, 3])
    assert [bench.scale_setting(label, 4) for label in config["settings"]] == [(4, 0), (3, 1), (2, 2), (1, 3)]
    assert (config["eval_questions"], config["eval_steps"], config["lora_r"]) == (512, 60, 16)
    run_dir = tmp_path / "run"
    bench.write_node_config(run_dir, config)
    command = bench.swarm_command(config, 2, 2, 1, run_dir)
    configs = [command[i + 1] for i, arg in enumerate(command) if arg == "--node-config"]
    node_args = command[command.index("--status-interval") + 2 :]
    node_args = [arg for arg in node_args if arg not in ("--node-config", *configs)]
    assert "--model" not in node_args  # a flag would override the model each node's config names
    models = []
    for index in range(config["peers"]):  # as local-swarm starts node i: the i-th config, cycling
        argv = node_command(index, run_dir, 100, node_args, ["/ip4/127.0.0.1/tcp/1/p2p/x"], 4, configs[index % 2])
        args, node, _ = parse_node_args(argv[3:])
        models.append(node.model)
        assert [task["name"] for task in node.tasks] == ["basic_arithmetic", "count_bits", "chain_sum"]
        assert (args.num_local, args.num_external, args.learning_rate, node.lora_r) == (2, 2, 2e-4, 16)
    assert models == ["default", str(strong_model), "default", str(strong_model)]


def test_the_run_identity_holds_the_stronger_models_digest(bench, strong_peer, strong_model, tmp_path):
    config = _config(bench, tmp_path, strong_model, "--settings", "4/4", "--seeds", "0")
    identity = bench.run_identity(config, 2, 2, 0)
    assert identity["strong_model_digest"] == strong_peer.model_digest(strong_model)
    moved = shutil.copytree(strong_model, tmp_path / "moved")
    assert bench.run_identity(_config(bench, tmp_path, moved, "--settings", "4/4"), 2, 2, 0) == identity

    # a completed run of another stronger model is not this run
    other = shutil.copytree(strong_model, tmp_path / "other")
    (other / "generation_config.json").write_text("{}")
    run_dir = bench.run_dir_of(Path(config["runs_dir"]), "cpu-hard-strong", 2, 2, 0)
    run_dir.mkdir(parents=True)
    marker = {"identity": bench.run_identity(_config(bench, tmp_path, other, "--settings", "4/4"), 2, 2, 0)}
    (run_dir / bench.COMPLETE).write_text(json.dumps(marker))
    with pytest.raises(SystemExit, match="another configuration"):
        bench.run_all(config, write=lambda line: None)

    # profiles without stronger peers keep their identity, and refuse the option
    hard = bench.build_config(*bench.parse_args(["--profile", "cpu-hard", "--runs-dir", str(tmp_path)]))
    assert "strong_model_digest" not in bench.run_identity(hard, 1, 1, 0)
    with pytest.raises(SystemExit, match="not cpu-hard"):
        bench.build_config(*bench.parse_args(["--profile", "cpu-hard", "--strong-model", str(strong_model)]))
    with pytest.raises(SystemExit, match="--strong-model DIR is required"):
        bench.build_config(*bench.parse_args(["--profile", "cpu-hard-strong"]))


def test_strong_profile_end_to_end_on_tiny_models(bench, strong_peer, tiny_model_a, strong_model, tmp_path):
    """A real local swarm: node 0 a student of tiny model A, node 1 the stronger model; the completed run's marker
    names the stronger model's digest, and a second invocation skips it."""
    argv = ["--profile", "cpu-hard-strong", "--model", str(tiny_model_a), "--strong-model", str(strong_model),
            "--settings", "4/4", "--seeds", "0", "--peers", "2", "--steps", "1", "--max-completion-length", "8",
            "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results"), "--allow-dirty",
            "--", "--eval_questions", "4"]  # fmt: skip
    assert bench.main(argv) == 0
    run_dir = tmp_path / "runs" / "cpu-hard-strong" / "2-2" / "seed-0"
    ran = [json.loads((run_dir / f"node-{i}" / "node-run.json").read_text()) for i in range(2)]
    assert [node["model"] for node in ran] == [str(tiny_model_a), str(strong_model)]
    assert all((node["num_local"], node["num_external"]) == (2, 2) for node in ran)
    marker = json.loads((run_dir / bench.COMPLETE).read_text())
    assert marker["identity"]["strong_model_digest"] == strong_peer.model_digest(strong_model)
    assert bench.main(argv) == 0
    assert len((run_dir / bench.ATTEMPTS).read_text().splitlines()) == 1  # complete: not started again
