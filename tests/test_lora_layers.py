"""sapo.speed.lora_layers: the fused LoRA training forward gives PEFT's outputs and gradients, is used only where it
applies, and leaves the layers as they were."""

from __future__ import annotations

import contextlib

import pytest
import torch
from peft import get_peft_model

from sapo.models import LoraSpec, build_tiny_model, lora_config
from sapo.speed.lora_layers import fused_lora_forward, plain_lora_linears


def _lora_model(tokenizer, alpha: int = 8, dropout: float = 0.0, use_dora: bool = False):
    """A tiny model with LoRA r=4 adapters whose B matrices are non-zero (so the adapters change the loss)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = lora_config(LoraSpec(r=4, alpha=alpha, dropout=dropout))
        config.use_dora = use_dora
        model = get_peft_model(build_tiny_model(tokenizer, seed=0), config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
    return model


def _pass(model, ids, fused: bool, bf16: bool):
    """The loss and the adapters' gradients of one training pass."""
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with autocast, fused_lora_forward(model) if fused else contextlib.nullcontext():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("alpha, bf16", [(8, False), (12, False), (8, True)])
def test_the_fused_forward_gives_peft_s_loss_and_gradients(smollm_tokenizer, alpha, bf16):
    """float32: PEFT's values up to float rounding (scaling 2 and 3); under bf16 autocast, within bf16's rounding."""
    model = _lora_model(smollm_tokenizer, alpha=alpha)
    ids = torch.tensor([smollm_tokenizer("What is 2 + 3? It is five, since 2 + 3 = 5.")["input_ids"]] * 2)
    peft_loss, peft_grads = _pass(model, ids, fused=False, bf16=bf16)
    fused_loss, fused_grads = _pass(model, ids, fused=True, bf16=bf16)
    assert peft_grads.keys() == fused_grads.keys() and peft_grads and all("lora_" in n for n in peft_grads)
    tolerance = dict(atol=2e-2, rtol=2e-2) if bf16 else dict(atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fused_loss, peft_loss, **tolerance)
    for name, grad in peft_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, **tolerance)
        assert fused_grads[name].abs().sum() > 0, name


def test_the_fused_forward_replaces_peft_s_inside_the_context_and_restores_it(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    layers = [layer for layer, _ in plain_lora_linears(model)]
    assert len(layers) > 0
    calls = []
    hooks = [layer.lora_B["default"].register_forward_hook(lambda *a: calls.append(1)) for layer in layers]
    ids = torch.tensor([smollm_tokenizer("one two three")["input_ids"]])
    with fused_lora_forward(model):
        assert all("forward" in vars(layer) for layer in layers)
        model(input_ids=ids)
    assert calls == []  # the fused forward reads lora_B's weight; PEFT's would call the module
    assert all("forward" not in vars(layer) for layer in layers)  # the class's forward is back
    model(input_ids=ids)
    assert len(calls) == len(layers)
    for hook in hooks:
        hook.remove()


def test_a_layer_whose_forward_a_hook_replaced_keeps_it(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    hooked = plain_lora_linears(model)[0][0]
    hooked.forward = hook = hooked.forward  # e.g. accelerate's hook on the instance
    with fused_lora_forward(model):
        assert vars(hooked)["forward"] is hook
        assert sum("forward" in vars(layer) for layer, _ in plain_lora_linears(model)) > 1
    assert vars(hooked)["forward"] is hook  # not deleted on exit


@pytest.mark.parametrize("variant", [dict(dropout=0.1), dict(use_dora=True)])
def test_layers_with_dropout_or_dora_keep_peft_s_forward(smollm_tokenizer, variant):
    model = _lora_model(smollm_tokenizer, **variant)
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    assert layers
    with fused_lora_forward(model):
        assert all("forward" not in vars(layer) for layer in layers)
