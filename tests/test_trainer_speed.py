"""The speed-ups inside SAPOTrainer's step, on tiny random models: they train the same steps as the paths they
replace, and put back what they replaced."""

from __future__ import annotations

import contextlib

import pytest
import torch

from sapo import SAPOConfig, SAPOTrainer
from sapo.models import build_tiny_model
from sapo.probe import PolicyProbe
from swarm import MemorySwarm
from tests.trainer_fixtures import G, _args, _external_group, _math_dataset, _metric, _trainer


def test_the_lm_head_scores_only_completion_tokens_and_trl_is_left_as_it_was(tmp_path, smollm_tokenizer, monkeypatch):
    import trl.trainer.utils as trl_utils

    choose = trl_utils._use_triton
    scored_rows = []
    chunked = trl_utils._ChunkedLogProbFunction

    class Recording(chunked):
        @staticmethod
        def forward(ctx, hidden, *args, **kwargs):
            scored_rows.append(hidden.shape[0])
            return chunked.forward(ctx, hidden, *args, **kwargs)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Recording)
    trainer = _trainer(tmp_path, smollm_tokenizer, "compact", lambda prompts, completions, **kw: [1.0] * len(prompts),
                       num_external=0)  # fmt: skip
    trainer.train()
    # each loss pass scores its completion tokens (at most G rows of 12), not the prompt and padding positions too
    assert scored_rows and all(rows <= G * 12 for rows in scored_rows)
    assert trl_utils._use_triton is choose  # the choice is changed inside SAPOTrainer's pass only


def test_bf16_loss_pass_casts_the_frozen_base_once_and_trains_the_same(tmp_path, smollm_tokenizer, monkeypatch):
    """Under CPU bf16 autocast a LoRA node's loss pass computes with bf16 copies of its frozen weights
    (sapo.speed.precision), made once, and attends in float32: the steps are exactly those of plain autocast, which
    casts the weights at every pass."""
    from sapo.models import LoraSpec, lora_config
    from sapo.speed.precision import _FROZEN_COPIES

    def train(name: str) -> SAPOTrainer:
        trainer = SAPOTrainer(
            model=build_tiny_model(smollm_tokenizer, seed=0), reward_funcs=[lambda completions, **kw: [
                float(len(c[0]["content"]) % 3) for c in completions]],
            args=_args(tmp_path, name, bf16=True, use_cpu=True, num_external=0), train_dataset=_math_dataset(),
            processing_class=smollm_tokenizer, peft_config=lora_config(LoraSpec(r=4, alpha=8, dropout=0.0)),
        )  # fmt: skip
        trainer.train()
        return trainer

    import transformers.integrations.sdpa_attention as sdpa

    attention_dtypes, forward = [], sdpa.sdpa_attention_forward

    def spy(module, query, *args, **kwargs):  # reached only through sapo.speed.precision's float32 attention
        attention_dtypes.append(query.dtype)
        return forward(module, query, *args, **kwargs)

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", spy)
    swapped = train("swapped")
    base = swapped.accelerator.unwrap_model(swapped.model)
    frozen = [m.weight for m in base.modules() if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad]
    assert frozen and all(w in _FROZEN_COPIES for w in frozen)
    assert attention_dtypes and set(attention_dtypes) == {torch.float32}  # the loss passes attended in float32
    assert base.config._attn_implementation == "sdpa"
    # the same steps as plain autocast (each frozen weight cast at every pass) with the same float32 attention
    monkeypatch.setattr("sapo.speed.precision.linear_weights_in", lambda *args, **kwargs: contextlib.nullcontext())
    plain = train("plain")
    assert _metric(swapped, "loss") == _metric(plain, "loss") and len(_metric(plain, "loss")) == 2
    adapters = {n: p for n, p in base.named_parameters() if p.requires_grad}
    plain_adapters = dict(plain.accelerator.unwrap_model(plain.model).named_parameters())
    assert adapters and all(torch.equal(p, plain_adapters[n]) for n, p in adapters.items())


def test_the_plausibility_pass_runs_in_bf16_with_merged_adapters_where_bf16_is_on(tmp_path, smollm_tokenizer,
                                                                                   monkeypatch):  # fmt: skip
    """Under CPU bf16 the plausibility pass gets generation's speed-ups: LoRA adapters merged, into weights made in
    bf16 once per pass (not cast at every layer call by the autocast that accelerate wraps the model in); being one
    forward pass, it does not pack them for oneDNN."""
    from sapo.models import LoraSpec, lora_config

    swarm = MemorySwarm(seed=0)
    sender = swarm.join("sender")
    sender.publish(
        [_external_group("What is 0 + 0?", ["0", "11", "zero", "222"], f"g{i}", answer="0") for i in range(2)]
    )
    seen, policy_logps = [], PolicyProbe._logps

    def spy(self, *args):  # each adapted layer's weight and output dtype, and whether its adapters were merged
        layers = [m for m in self.trainer.model.modules() if hasattr(m, "merged_adapters") and hasattr(m, "base_layer")]
        hooks = [
            m.base_layer.register_forward_hook(
                lambda mod, args, out, owner=m: seen.append(
                    (mod.weight.dtype, out.dtype, bool(owner.merged_adapters), "forward" in vars(mod))
                )
            )
            for m in layers
        ]
        try:
            return policy_logps(self, *args)
        finally:
            for hook in hooks:
                hook.remove()

    monkeypatch.setattr(PolicyProbe, "_logps", spy)
    trainer = SAPOTrainer(
        model=build_tiny_model(smollm_tokenizer, seed=0), reward_funcs=[lambda completions, **kw: [
            float(len(c[0]["content"]) % 3) for c in completions]],
        args=_args(tmp_path, "bf16", bf16=True, use_cpu=True, num_local=1, num_external=1, max_steps=2,
                   plausibility_margin=1.0, external_source_policy="trust"),
        train_dataset=_math_dataset(), processing_class=smollm_tokenizer, swarm=swarm.join("receiver"),
        peft_config=lora_config(LoraSpec(r=4, alpha=8, dropout=0.0)),
    )  # fmt: skip
    trainer.train()
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16, True, False)}  # one pass: weights not packed


@pytest.mark.parametrize("fused", [True, False])
def test_the_cpu_fused_loss_pass_switch(tmp_path, smollm_tokenizer, monkeypatch, fused):
    """On a CPU the loss pass runs the fused LoRA forward and the lean LM head unless `cpu_fused_loss_pass` is off;
    then PEFT's and TRL's own run."""
    import sapo.speed.speed_ups as speed_ups
    from sapo.models import LoraSpec, lora_config

    entered = []
    for name in ("fused_lora_forward", "lean_cpu_lm_head"):
        real = getattr(speed_ups, name)
        monkeypatch.setattr(speed_ups, name, lambda *a, real=real, name=name: entered.append(name) or real(*a))
    trainer = SAPOTrainer(
        model=build_tiny_model(smollm_tokenizer, seed=0), reward_funcs=[lambda completions, **kw: [
            float(len(c[0]["content"]) % 3) for c in completions]],
        args=_args(tmp_path, str(fused), num_external=0, max_steps=1, cpu_fused_loss_pass=fused),
        train_dataset=_math_dataset(), processing_class=smollm_tokenizer,
        peft_config=lora_config(LoraSpec(r=4, alpha=8, dropout=0.0)),
    )  # fmt: skip
    trainer.train()
    assert _metric(trainer, "loss")
    assert (set(entered) == {"fused_lora_forward", "lean_cpu_lm_head"}) is fused and (not entered) is (not fused)


def test_scoring_each_prompt_once_takes_the_same_steps(tmp_path, smollm_tokenizer, monkeypatch):
    """`scoring_prefill_once` runs each distinct prompt of the loss pass once: the step
    (its loss and, under plain SGD, the adapters it trains) is that of TRL's pass over whole rows, up to rounding.
    One step: a second one samples from weights that differ by rounding, so its completions may differ."""
    import sapo.speed.speed_ups as speed_ups
    from sapo.models import LoraSpec, lora_config

    calls, shared = [], speed_ups.shared_prompt_logps

    def spy(*args, **kwargs):
        calls.append(args[1].shape[0])
        return shared(*args, **kwargs)

    monkeypatch.setattr(speed_ups, "shared_prompt_logps", spy)

    def train(name: str, once: bool) -> SAPOTrainer:
        trainer = SAPOTrainer(
            model=build_tiny_model(smollm_tokenizer, seed=0), reward_funcs=[lambda completions, **kw: [
                float(len(c[0]["content"]) % 3) for c in completions]],
            args=_args(tmp_path, name, num_external=0, scoring_prefill_once=once, optim="sgd", learning_rate=1.0,
                       bf16=False, max_steps=1),
            train_dataset=_math_dataset(),
            processing_class=smollm_tokenizer, peft_config=lora_config(LoraSpec(r=4, alpha=8, dropout=0.0)),
        )  # fmt: skip
        trainer.train()
        return trainer

    cpu_default = SAPOConfig(output_dir=str(tmp_path / "defaults")).scoring_prefill_once
    assert cpu_default is (not torch.cuda.is_available())  # on with a CPU, TRL's pass with a GPU
    once = train("once", True)
    assert calls and all(rows == G for rows in calls)  # every loss pass, each of G rows sharing its prompt
    calls.clear()
    plain = train("plain", False)
    assert not calls
    torch.testing.assert_close(torch.tensor(_metric(once, "loss")), torch.tensor(_metric(plain, "loss")),
                               atol=1e-5, rtol=1e-4)  # fmt: skip
    adapters = dict(plain.accelerator.unwrap_model(plain.model).named_parameters())
    trained = [(n, p) for n, p in once.accelerator.unwrap_model(once.model).named_parameters() if p.requires_grad]
    assert trained and any(p.abs().sum() > 0 for n, p in trained if "lora_B" in n)
    # Plain SGD from zero-initialised B matrices: each B is minus its gradient, so equal gradients give equal B.
    steps = [(p.detach().flatten(), adapters[n].detach().flatten()) for n, p in trained if "lora_B" in n]
    difference = torch.cat([a - b for a, b in steps]).norm() / torch.cat([b for _, b in steps]).norm()
    assert difference < 1e-3, difference
