"""sapo.speed.precision: linear weights cast to bf16 once for CPU autocast, with autocast's own products, and packed for
oneDNN bit for bit; attention in float32 under that autocast."""

from __future__ import annotations

import contextlib

import pytest
import torch
from peft import get_peft_model
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from sapo.models import LoraSpec, build_tiny_model, lora_config
from sapo.speed.precision import FLOAT32_SDPA, _can_pack, float32_attention, linear_weights_in, packed_bf16_linears


def _lora_model(tokenizer):
    """A tiny model with LoRA adapters whose B matrices are non-zero (so the adapters change the loss)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = get_peft_model(build_tiny_model(tokenizer, seed=0), lora_config(LoraSpec(r=4, alpha=8, dropout=0.0)))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
    return model


def _loss_and_grads(model, ids, swap: bool):
    """A training pass under bf16 autocast, with or without the frozen weights swapped for bf16 copies."""
    swapped = linear_weights_in(model, torch.bfloat16, frozen_only=True) if swap else contextlib.nullcontext()
    with torch.autocast("cpu", dtype=torch.bfloat16), swapped:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()  # after the context: the backward reads what the forward saved
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def test_a_training_pass_with_frozen_weights_in_bf16_equals_plain_autocast(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    ids = torch.tensor([smollm_tokenizer("What is 2 + 3? It is five.")["input_ids"]])
    before = dict(model.named_parameters())
    plain_loss, plain_grads = _loss_and_grads(model, ids, swap=False)
    swapped_loss, swapped_grads = _loss_and_grads(model, ids, swap=True)
    assert torch.equal(plain_loss, swapped_loss)
    assert plain_grads.keys() == swapped_grads.keys() and len(plain_grads) > 0
    assert all("lora_" in n for n in plain_grads)  # the adapters train, the base is frozen
    assert all(torch.equal(plain_grads[n], swapped_grads[n]) for n in plain_grads)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)  # the same objects back
    assert all(p.dtype == torch.float32 for p in after.values())


def test_frozen_weights_are_cast_once_and_again_after_a_change(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    head = model.get_output_embeddings()
    original = head.weight
    with linear_weights_in(model, torch.bfloat16, frozen_only=True):
        first = head.weight
        base = {p.dtype for n, p in model.named_parameters() if n.endswith("base_layer.weight")}
        adapters = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    assert first.dtype == torch.bfloat16 and torch.equal(first, original.detach().to(torch.bfloat16))
    assert base == {torch.bfloat16}
    assert adapters == {torch.float32}  # trained weights are left to autocast, so their gradients flow
    with linear_weights_in(model, torch.bfloat16, frozen_only=True):
        assert head.weight is first  # kept: a LoRA base is cast once, not at each step
    with torch.no_grad():
        original.add_(1.0)  # e.g. weights loaded in place
    with linear_weights_in(model, torch.bfloat16, frozen_only=True):
        assert head.weight is not first and torch.equal(head.weight, original.detach().to(torch.bfloat16))
    assert head.weight is original


def test_without_frozen_only_every_weight_is_swapped_for_a_pass_without_gradients(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    with torch.no_grad(), linear_weights_in(model, torch.bfloat16):
        dtypes = {p.dtype for n, p in model.named_parameters() if n.endswith("weight") and "norm" not in n}
        dtypes.discard(model.get_input_embeddings().weight.dtype)  # an embedding is a lookup, not a product
    assert dtypes == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())


def _attention_input_dtypes(monkeypatch) -> list[torch.dtype]:
    """Records the query dtype of every call of transformers' SDPA attention."""
    import transformers.integrations.sdpa_attention as sdpa

    seen, forward = [], sdpa.sdpa_attention_forward

    def spy(module, query, *args, **kwargs):
        seen.append(query.dtype)
        return forward(module, query, *args, **kwargs)

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", spy)
    return seen


def test_float32_attention_under_bf16_autocast_trains_and_restores_the_config(smollm_tokenizer, monkeypatch):
    model = _lora_model(smollm_tokenizer)
    ids = torch.tensor([smollm_tokenizer("What is 2 + 3? It is five.")["input_ids"]])
    with torch.no_grad():
        exact = model(input_ids=ids, labels=ids).loss  # float32 throughout
    seen = _attention_input_dtypes(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16), float32_attention(model):
        assert model.config._attn_implementation == FLOAT32_SDPA
        loss = model(input_ids=ids, labels=ids).loss
    assert model.config._attn_implementation == "sdpa"  # generation and evaluation keep the model's own
    assert FLOAT32_SDPA not in AttentionInterface._global_mapping  # registered for the context only
    assert FLOAT32_SDPA not in AttentionMaskInterface._global_mapping
    assert seen == [torch.float32] * model.config.num_hidden_layers
    loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert abs(loss.item() - exact.item()) < 0.05  # bf16 elsewhere: close to float32, not equal


def test_float32_attention_leaves_other_attention_implementations_alone(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    model.config._attn_implementation = "eager"
    with float32_attention(model):
        assert model.config._attn_implementation == "eager"


@pytest.mark.skipif(
    not _can_pack(), reason="no oneDNN bf16 path on this PyTorch or CPU (packing is then skipped, tested below)"
)
def test_packed_bf16_linears_give_autocast_s_logits_bit_for_bit_and_restore_the_layers(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    ids = torch.tensor([smollm_tokenizer("What is 2 + 3? It is five.")["input_ids"]] * 3)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), linear_weights_in(model, torch.bfloat16):
        plain = model(input_ids=ids).logits
        with packed_bf16_linears(model):
            assert all("forward" in vars(m) for m in linears)  # every bf16 layer computes with its packed weight
            packed = model(input_ids=ids).logits
            single = model(input_ids=ids[:1, :5]).logits  # other row counts than the packing's hint
    assert torch.equal(plain, packed)
    assert torch.equal(single, plain[:1, :5])
    assert all("forward" not in vars(m) for m in linears)


def test_packing_skips_float32_layers_and_replaced_forwards_and_packs_a_frozen_weight_once(smollm_tokenizer):
    from sapo.speed import precision

    model = _lora_model(smollm_tokenizer)
    head = model.get_output_embeddings()
    hooked = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    hook = hooked.forward  # e.g. accelerate's hook: an instance forward is left alone
    hooked.forward = hook
    with torch.no_grad(), packed_bf16_linears(model):
        assert not any("forward" in vars(m) for m in model.modules() if m is not hooked)  # float32: not packed
    with torch.no_grad(), linear_weights_in(model, torch.bfloat16), packed_bf16_linears(model):
        bf16_head = head.weight
        first = precision._PACKED.get(bf16_head)
        assert ("forward" in vars(head)) is _can_pack()
        assert hooked.weight.dtype == torch.bfloat16 and vars(hooked)["forward"] is hook  # bf16, yet not packed
    assert vars(hooked)["forward"] is hook and "forward" not in vars(head)
    with torch.no_grad(), linear_weights_in(model, torch.bfloat16), packed_bf16_linears(model):
        assert head.weight is bf16_head and precision._PACKED.get(bf16_head) is first  # packed once
    del hooked.forward


def test_without_onednn_packing_leaves_every_layer_as_it_is(smollm_tokenizer, monkeypatch):
    from sapo.speed import precision

    monkeypatch.setattr(precision, "_can_pack", lambda: False)
    model = _lora_model(smollm_tokenizer)
    with torch.no_grad(), linear_weights_in(model, torch.bfloat16), packed_bf16_linears(model):
        assert not any("forward" in vars(m) for m in model.modules())
