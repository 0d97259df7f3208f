"""sapo.speed's surface: one switch turns the speed-ups off or leaves each to its own field, and every speed-up is
applied inside the call that needs it, putting back what it replaced. Tiny random models with a real tokenizer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import trl.trainer.utils as trl_utils
from datasets import Dataset
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from trl import GRPOConfig

from sapo import SAPOConfig, SAPOTrainer
from sapo.models import LoraSpec, build_tiny_model, lora_config
from sapo.speed import SpeedUps
from sapo.speed.devices import SPEED_UP_FIELDS, device_defaults
from sapo.speed.precision import FLOAT32_SDPA, _can_pack
from sapo.speed.scoped import attribute_replaced, entry_added
from testbed.tiny_run import tiny_config

BATCH = dict(num_generations=4, per_device_train_batch_size=4)


def test_speedups_off_turns_every_switch_off_and_a_field_set_explicitly_wins(tmp_path):
    auto = SAPOConfig(output_dir=str(tmp_path), **BATCH)
    assert {name: getattr(auto, name) for name in SPEED_UP_FIELDS} == {n: device_defaults()[n] for n in SPEED_UP_FIELDS}
    off = SAPOConfig(output_dir=str(tmp_path), speedups="off", **BATCH)
    assert all(getattr(off, name) is False for name in SPEED_UP_FIELDS)
    assert not SpeedUps.from_config(off).on and SpeedUps.from_config(auto).on
    one = SAPOConfig(output_dir=str(tmp_path), speedups="off", generation_merge_adapters=True, **BATCH)
    assert one.generation_merge_adapters is True and one.generation_prefill_once is False
    none = SAPOConfig(output_dir=str(tmp_path), cpu_fused_loss_pass=False, **BATCH)
    assert none.cpu_fused_loss_pass is False and none.generation_merge_adapters is True


def test_an_unknown_speedups_value_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"speedups='fast'.*\['auto', 'off'\]"):
        SAPOConfig(output_dir=str(tmp_path), speedups="fast", **BATCH)


def test_the_speedups_switch_is_a_node_flag():
    from sapo.node.options import parse_node_args

    off, _, _ = parse_node_args(["--speedups", "off"])
    assert off.speedups == "off" and off.generation_prefill_once is False and off.cpu_fused_loss_pass is False


def test_a_config_without_sapo_s_fields_runs_no_speed_up(tmp_path):
    grpo = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **BATCH)
    assert SpeedUps.from_config(grpo) == SpeedUps() and SpeedUps.from_config(None) == SpeedUps()
    built_by_hand = object.__new__(SAPOTrainer)  # as TRL's own tests build a trainer, without its __init__
    built_by_hand.args = SimpleNamespace(report_to=[])
    assert SpeedUps.of(built_by_hand) is SpeedUps.of(built_by_hand) and not SpeedUps.of(built_by_hand).on


def test_a_replaced_attribute_and_a_registry_entry_are_put_back():
    class Owner:
        def method(self):
            return "class"

        @property
        def value(self):
            return self._value

        @value.setter
        def value(self, v):
            self._value = v

    owner = Owner()
    owner.value = "mine"
    with attribute_replaced(owner, "method", lambda: "instance") as original:
        assert owner.method() == "instance" and original() == "class"
    assert "method" not in vars(owner) and owner.method() == "class"  # inherited: deleted again
    with attribute_replaced(owner, "value", "theirs"):
        assert owner.value == "theirs"
    assert owner.value == "mine"  # a property: set back through its setter
    registry = {"sdpa": 1}
    with entry_added(registry, "new", 2), entry_added(registry, "sdpa", 3):
        assert registry == {"sdpa": 1, "new": 2}  # an entry already there is someone else's: left alone
    assert registry == {"sdpa": 1}


def _dataset(n: int = 8) -> Dataset:
    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
                "provenance": json.dumps({"source": "custom", "dataset": "doubling", "config": {}, "index": i}),
            }
            for i in range(n)
        ]
    )


def _patches(model) -> dict[str, bool]:
    """Which of the speed-ups' replacements are installed right now."""
    lora_layers = [m for m in model.modules() if hasattr(m, "lora_A")]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return {
        "torch.multinomial": torch.multinomial is not MULTINOMIAL,
        "trl _use_triton": trl_utils._use_triton is not USE_TRITON,
        "trl _ChunkedLogProbFunction": trl_utils._ChunkedLogProbFunction is not CHUNKED,
        "attention registry": FLOAT32_SDPA in AttentionInterface._global_mapping
        or FLOAT32_SDPA in AttentionMaskInterface._global_mapping,
        "LoRA layer forward": any("forward" in vars(m) for m in lora_layers),
        "linear layer forward": any("forward" in vars(m) for m in linears),
        "model.generate": "generate" in vars(model),
    }


MULTINOMIAL, USE_TRITON, CHUNKED = torch.multinomial, trl_utils._use_triton, trl_utils._ChunkedLogProbFunction


def test_every_replacement_is_installed_during_its_call_only(tmp_path, smollm_tokenizer):
    """A LoRA step under CPU bf16 with every speed-up: each of the replacements the speed-ups make (torch's sampler,
    TRL's LM-head choice and function, transformers' attention registry, layers' forwards, the model's `generate`)
    is seen installed while the model runs, and none is left installed after training."""
    trainer = SAPOTrainer(
        model=build_tiny_model(smollm_tokenizer, seed=0),
        reward_funcs=[lambda completions, **kw: [float(len(c[0]["content"]) % 3) for c in completions]],
        args=tiny_config(tmp_path, num_local=2, num_external=0, max_steps=1, bf16=True, learning_rate=1e-2),
        train_dataset=_dataset(),
        processing_class=smollm_tokenizer,
        peft_config=lora_config(LoraSpec(r=4, alpha=8, dropout=0.0)),
    )
    model = trainer.model
    before = _patches(model)
    seen: list[dict[str, bool]] = []
    hook = model.get_base_model().register_forward_pre_hook(lambda module, args: seen.append(_patches(model)))
    try:
        trainer.train()
    finally:
        hook.remove()
    assert not any(before.values())
    installed = {name for state in seen for name, on in state.items() if on}
    unpacked = set() if _can_pack() else {"linear layer forward"}  # a PyTorch without oneDNN packs nothing
    assert installed == set(before) - unpacked  # each one was in place during some forward pass
    generating = [s for s in seen if s["model.generate"]]
    assert generating and all(s["torch.multinomial"] and not s["trl _use_triton"] for s in generating)
    assert _patches(model) == before  # and nothing is left installed
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_the_generation_speed_ups_step_aside_for_a_vision_language_model(tmp_path, smollm_tokenizer):
    """The bridge tells the speed-ups whether TRL deems the model a vision-language one; for such a model none of the
    generation speed-ups runs (TRL's own generation does), and the reason is said."""
    trainer = SAPOTrainer(
        model=build_tiny_model(smollm_tokenizer, seed=0),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=tiny_config(tmp_path, num_local=2, num_external=0, max_steps=1, bf16=True),
        train_dataset=_dataset(),
        processing_class=smollm_tokenizer,
    )
    speed = SpeedUps.of(trainer)
    assert speed.generation_speed_ups(trainer, vision=False)  # a text model: they run
    assert speed.generation_speed_ups(trainer, vision=True) == []
    assert any(line.endswith(": a vision-language model or images") for line in speed.announced)
