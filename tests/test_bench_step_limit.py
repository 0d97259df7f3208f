"""benchmarks.step_limit --quick: a smoke test of the whole run on a tiny model (the machine's limits, the generation
variants, the node's step with each speed-up off and on beside plain TRL) and of its report; what of ``--device cuda``
and ``--random-weights`` a CPU can check (options, configurations, random weights of the same shapes, the GPU page)."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from benchmarks import step_limit
from benchmarks.machine_limits import best_seconds


def test_quick_run_writes_a_report_with_every_part(tmp_path, smollm_tokenizer_dir):
    assert step_limit.main(["--quick", "--threads", "1", "--skip-continuous-batching", "--output-dir",
                            str(tmp_path)]) == 0  # fmt: skip
    data = json.loads((tmp_path / "step_limit.json").read_text())
    assert (tmp_path / "step_limit.md").is_file() and (tmp_path / "step_limit.png").stat().st_size > 0
    assert data["record"]["git_commit"] and "dirty" in data["git"]
    assert data["limits"]["bandwidth_gb_s"] > 0 and all(
        r > 0 for r in data["limits"]["rates_gflop_s"]["float32"].values()
    )
    bounds = data["bounds"]["float32"]
    assert 0 < bounds["generation_prefill"] < bounds["generation"] and bounds["training pass"] > 0
    assert set(step_limit.GENERATION_VARIANTS[:4]) <= set(data["generation"]["variants"])
    assert all(v["wall"] > 0 and v["cpu"] > 0 for v in data["generation"]["variants"].values())
    summary = data["step_summary"]
    assert "plain TRL GRPOTrainer" in summary and "node, speed-ups off (today)" in summary and "node, both" in summary
    for name, steps in data["steps"].items():
        assert len(steps) == 2, name
        assert all(s["training pass"] > 0 and s["generation"] > 0 for s in steps), name
    # After its first step (own groups only: the plausibility reference), the node trains on a swarm group (J > 0).
    assert all(summary[n]["external_groups"] == 1 for n in summary if n.startswith("node"))
    assert "| plain TRL GRPOTrainer |" in (tmp_path / "step_limit.md").read_text()
    assert data["settings"]["device"] == "cpu" and not data["settings"]["random_weights"]
    assert step_limit.RANDOM_WEIGHTS_NOTE not in (tmp_path / "step_limit.md").read_text()

    # The same data as a GPU run with random weights would report it: wall seconds only, the weights' note.
    gpu = copy.deepcopy(data)
    gpu["settings"] |= {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "random_weights": True}
    page = "\n".join(step_limit.report_lines(gpu, gpu["record"]))
    assert "random weights of the default model's shapes: timings only" in page.lower()
    assert "CPU s" not in page and "threads" not in page and "wall seconds only" in page
    assert "device-to-device copy" in page and "| plain TRL GRPOTrainer |" in page
    step_limit.plot(gpu, tmp_path / "gpu.png")
    assert (tmp_path / "gpu.png").stat().st_size > 0


def test_step_summary_compares_steps_that_trained_on_the_swarm_group():
    def step(external: int, wall: float) -> dict[str, float]:
        return {"external_groups": external, "wall": wall, "cpu": wall, **dict.fromkeys(step_limit.SPLIT, 1.0)}

    # the first step (no swarm group yet) is left out, and so is the step whose swarm group was dropped
    records = [step(0, 9.0), step(1, 10.0), step(0, 14.0), step(1, 12.0)]
    summary = step_limit.summarize_steps(records, swarm_groups=1)
    assert summary["wall"] == 11.0 and summary["steps_measured"] == 2 and summary["steps_after_first"] == 3
    assert step_limit.summarize_steps(records, swarm_groups=0)["wall"] == 14.0  # plain TRL: no swarm group
    none_taken = step_limit.summarize_steps([step(0, 9.0), step(0, 14.0)], swarm_groups=1)
    assert none_taken["wall"] == 14.0 and none_taken["steps_measured"] == 1  # none qualified: all after the first


def test_device_and_random_weights_options():
    args = step_limit.parse_args([])
    assert args.device == "cpu" and not args.random_weights and args.export_shapes is None
    args = step_limit.parse_args(["--device", "cuda", "--model", "m", "--random-weights", "--quick"])
    assert (args.device, args.model, args.random_weights, args.reps, args.steps) == ("cuda", "m", True, 1, 2)
    with pytest.raises(SystemExit):
        step_limit.parse_args(["--device", "tpu"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no GPU")
def test_cuda_without_a_gpu_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no CUDA GPU"):
        step_limit.main(["--device", "cuda", "--quick", "--output-dir", str(tmp_path)])


def test_cpu_trainer_settings_are_unchanged_and_cuda_runs_as_the_node_there():
    args = step_limit.parse_args(["--quick"])
    cpu = step_limit._common_args(args, "out")
    assert cpu["use_cpu"] is True and cpu["gradient_checkpointing"] is False
    trl = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "beta": 0.0, "epsilon_high": 0.28}
    assert step_limit.trl_args(True) == {**trl, "bf16": False}
    assert list(step_limit.node_configs(True)) == [
        "node, speed-ups off (today)", "node, prefill once", "node, merged adapters", "node, both",
        "node, both + bf16", "node, both + bf16 + one micro-batch, prompts once (default here)",
    ]  # fmt: skip
    cpu_configs = step_limit.node_configs(True)
    assert all("gradient_checkpointing" not in c for c in cpu_configs.values())
    # today's node: 4-row micro-batches, TRL's loss pass; the default: the round in one micro-batch, prompts once
    assert cpu_configs["node, speed-ups off (today)"]["per_device_train_batch_size"] == 4
    default = cpu_configs["node, both + bf16 + one micro-batch, prompts once (default here)"]
    assert default["per_device_train_batch_size"] is None and default["scoring_prefill_once"] is True

    args = step_limit.parse_args(["--quick", "--device", "cuda"])
    gpu = step_limit._common_args(args, "out")
    assert gpu["use_cpu"] is False and "gradient_checkpointing" not in gpu  # each configuration says
    assert step_limit.trl_args(True, "cuda") == {**trl, "bf16": True, "gradient_checkpointing": True}
    configs = step_limit.node_configs(True, "cuda")
    assert configs["node, both + bf16 + one micro-batch (default here)"]["gradient_checkpointing"] is None
    assert configs["node, speed-ups off (today)"] == {"generation_prefill_once": False,
                                                      "generation_merge_adapters": False, "bf16": False,
                                                      "per_device_train_batch_size": 4, "scoring_prefill_once": False,
                                                      "gradient_checkpointing": None}  # fmt: skip
    assert configs["node, both + bf16 + one micro-batch, prompts once"]["gradient_checkpointing"] is False
    assert configs["node, both + bf16 + one micro-batch, no gradient checkpointing"]["gradient_checkpointing"] is False
    assert list(configs)[-1] == "node, both + bf16 + one micro-batch (default here)"


def test_best_seconds_waits_in_batches_only_when_told():
    calls, syncs = [], []
    best_seconds(lambda: calls.append(1), min_seconds=0.01, repeats=1)
    assert calls and not syncs
    calls.clear()
    best_seconds(lambda: calls.append(1), min_seconds=0.01, repeats=1, sync=lambda: syncs.append(1))
    assert len(syncs) >= 2 and len(calls) > len(syncs)  # batches of growing size, one wait each


def test_random_weights_have_the_shapes_and_tokenizer_of_the_model_without_its_weights(tiny_model_a, tmp_path):
    from sapo.models import load_policy

    shapes = tmp_path / "shapes"
    shutil.copytree(tiny_model_a, shapes)
    for weights in shapes.glob("*.safetensors"):
        weights.unlink()  # only the config and tokenizer are read
    trained, tokenizer = load_policy(tiny_model_a)
    model, random_tokenizer = step_limit.random_policy(shapes, seed=3)
    ignored = {"dtype": None, "_name_or_path": None}
    assert model.config.to_dict() | ignored == trained.config.to_dict() | ignored
    assert {n: p.shape for n, p in model.named_parameters()} == {n: p.shape for n, p in trained.named_parameters()}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert random_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert random_tokenizer.pad_token_id == model.config.pad_token_id == tokenizer.pad_token_id
    assert random_tokenizer.chat_template == tokenizer.chat_template
    assert not torch.equal(model.lm_head.weight, trained.lm_head.weight)
    again, _ = step_limit.random_policy(shapes, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))


def test_export_shapes_writes_config_and_tokenizer_without_weights(tiny_model_a, tmp_path, monkeypatch):
    import sapo.models

    monkeypatch.setattr(sapo.models, "default_model_path", lambda: tiny_model_a)
    assert step_limit.main(["--export-shapes", str(tmp_path / "shapes")]) == 0
    names = {p.name for p in (tmp_path / "shapes").iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(n.endswith((".safetensors", ".bin")) for n in names)
    model, _ = step_limit.random_policy(tmp_path / "shapes")
    assert model.config.vocab_size == json.loads((tiny_model_a / "config.json").read_text())["vocab_size"]
