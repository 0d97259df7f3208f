"""benchmarks.int8_generation: the int8 copy of a LoRA policy (made from the merged weights, the policy untouched), the
module swap that puts it in place for generation, the numerics helpers, and a quick run of the whole benchmark."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import int8_generation as bench
from sapo.models import LoraSpec, load_policy


@pytest.fixture()
def lora_policy(tiny_model_a):
    """A tiny policy with the node's LoRA adapter, its B matrices non-zero (as after training)."""
    model, tokenizer = load_policy(tiny_model_a, lora=LoraSpec(r=16, alpha=32, dropout=0.0))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model.eval(), tokenizer


def _ids(tokenizer) -> torch.Tensor:
    return torch.tensor([tokenizer("What is 12 plus 30? Answer with a number.")["input_ids"]])


def test_int8_copy_leaves_the_policy_untouched_and_computes_close_logits(lora_policy):
    model, tokenizer = lora_policy
    ids = _ids(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modules_before = dict(model.named_modules())
    with torch.no_grad():
        logits = model(ids).logits

    copies = bench.int8_linears(model)

    lora_layers = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and hasattr(m, "get_base_layer")]
    assert sorted(copies) == sorted([*lora_layers, "base_model.model.lm_head"])
    assert all(isinstance(c, torch.ao.nn.quantized.dynamic.Linear) for c in copies.values())
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert dict(model.named_modules()) == modules_before  # no module replaced, no merge left behind
    assert not any(m.merged for n, m in model.named_modules() if n in lora_layers)

    with torch.no_grad(), bench.swapped_modules(model, copies):
        assert model.get_submodule(lora_layers[0]) is copies[lora_layers[0]]
        int8_logits = model(ids).logits
    # The int8 copy carries the adapters (merged) and computes nearly the same distribution, but not bit-identical.
    int8_logps, logps = torch.log_softmax(int8_logits, -1), torch.log_softmax(logits, -1)
    assert not torch.equal(int8_logits, logits)
    assert (int8_logps - logps).abs().mean().item() < 0.05 * logps.std().item()
    # Out of the context, the policy is the float32 one again.
    assert model.get_submodule(lora_layers[0]) is modules_before[lora_layers[0]]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)


@pytest.mark.parametrize("parts", ["all", "base"])
def test_int8_copy_carries_the_adapters(lora_policy, parts):
    """Without the adapters (merged in, or running unmerged beside the int8 base layers), the int8 copy would compute
    the base model: it must be far closer to the policy."""
    model, tokenizer = lora_policy
    ids = _ids(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        policy = torch.log_softmax(model(ids).logits, -1)
        with model.disable_adapter():
            base = torch.log_softmax(model(ids).logits, -1)
        copies = bench.int8_linears(model, parts)
        with bench.swapped_modules(model, copies):
            int8 = torch.log_softmax(model(ids).logits, -1)
    assert (int8 - policy).abs().mean() < 0.2 * (base - policy).abs().mean()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    if parts == "base":  # the frozen base layers and the head; the adapters stay the model's own
        assert all(k.endswith(".base_layer") for k in copies if not k.endswith("lm_head"))
        assert len(copies) == len(bench.int8_linears(model, "all"))


def test_parts_split_body_and_head_and_the_swap_is_undone_on_error(lora_policy):
    model, tokenizer = lora_policy
    every, body, head = (bench.int8_linears(model, parts) for parts in ("all", "body", "head"))
    assert list(head) == ["base_model.model.lm_head"] and set(body) | set(head) == set(every)
    assert not set(body) & set(head)
    with pytest.raises(ValueError, match="parts must be"):
        bench.int8_linears(model, "lora")
    lm_head = model.get_submodule("base_model.model.lm_head")
    name = next(iter(body))
    original = model.get_submodule(name)
    with pytest.raises(RuntimeError, match="boom"), bench.swapped_modules(model, body):
        assert model.get_submodule("base_model.model.lm_head") is lm_head
        raise RuntimeError("boom")
    assert model.get_submodule(name) is original


def test_generation_with_the_int8_head_alone_keeps_the_adapters_merged(lora_policy):
    """The head-only variant generates through today's path (LoRA merged) with the int8 head swapped in, and leaves the
    policy as it was."""
    model, tokenizer = lora_policy
    lm_head = model.get_submodule("base_model.model.lm_head")
    rows = [_ids(tokenizer)[0].tolist()] * 2
    config = bench.generation_config(tokenizer, greedy=True)
    config.min_new_tokens = config.max_new_tokens = 6
    head = bench.generate(model, tokenizer, rows, config, bench.int8_linears(model, "head"))
    assert len(head) == 2 and all(len(c) == 6 for c in head) and head[0] == head[1]
    assert model.get_submodule("base_model.model.lm_head") is lm_head
    assert not any(getattr(m, "merged", False) for m in model.modules())


def test_a_dora_adapter_is_refused_by_name(tiny_model_a):
    from peft import LoraConfig, get_peft_model

    model, _ = load_policy(tiny_model_a)
    dora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], use_dora=True, task_type="CAUSAL_LM"))
    for parts in ("all", "base"):
        with pytest.raises(ValueError, match=r"q_proj.*DoRA"):
            bench.int8_linears(dora, parts)


def test_logp_drift_and_greedy_agreement():
    reference = torch.log_softmax(torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]]), -1)
    other = reference.clone()
    other[0, 0] = torch.log_softmax(torch.tensor([1.0, 2.0, 2.5]), -1)
    drift = bench.logp_drift(reference, other, [[2, 1]])
    expected = (other[0, 0, 2] - reference[0, 0, 2]).item()
    assert drift["tokens"] == 2 and drift["max_abs"] == pytest.approx(abs(expected))
    assert drift["mean_abs"] == pytest.approx(abs(expected) / 2) and drift["mean"] == pytest.approx(expected / 2)
    assert drift["mean_kl"] > 0 and bench.logp_drift(reference, reference, [[2, 1]])["mean_kl"] == 0

    agreement = bench.greedy_agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 9], [7, 5, 6]])
    assert agreement == {"share_same": pytest.approx(4 / 6), "mean_common_prefix": 1.0}


def test_quick_run_writes_a_report(tmp_path, smollm_tokenizer_dir):
    assert bench.main(["--quick", "--threads", "1", "--output-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "int8_generation.json").read_text())
    assert data["record"]["git_commit"] and "dirty" in data["git"] and data["quantized_engine"]
    assert set(bench.VARIANTS) <= set(data["timings"]) and all(t["wall"] > 0 for t in data["timings"].values())
    assert set(data["numerics"]) == set(bench.PARTS) and all("share_same" in x for x in data["numerics"].values())
    layers = data["int8_layers"]
    assert layers[bench.INT8] == layers[bench.INT8_BODY] + 1 and layers[bench.INT8_HEAD] == 1
    assert len(data["timings"][f"make {bench.INT8_HEAD}"]["runs"]["wall"]) == 1  # made once, not per repetition
    page = (tmp_path / "int8_generation.md").read_text()
    assert "(b+c)/a" in page and "shared" in page
