"""Passes without gradients (generation, evaluation, the plausibility pass) at the machine's speed: LoRA adapters
merged, bf16 autocast, and on a CPU bf16 weights cast once and packed.

- **adapters merged** (:func:`inference_weights`): every LoRA linear layer of a PEFT model runs on one merged weight
  (base + B A scaled) instead of three matmuls. The merged weight is a new tensor swapped in for the base weight, and
  the base weight object is put back afterwards, untouched: training continues on exactly the weights it left.
- **bf16** (:func:`inference_context` with ``bf16``): bf16 autocast on a CPU or a CUDA GPU; on a CPU with the merged
  weights made in bf16 directly and every other linear layer's weight (the LM head above all) cast to bf16 once for
  the context (float32 master weights are kept for training), each packed once for oneDNN
  (`sapo.speed.precision.packed_bf16_linears`: the same products).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from sapo.speed.lora_layers import plain_lora_linears
from sapo.speed.precision import linear_weights_in, packed_bf16_linears, weight_in

__all__ = ["bf16_autocast", "inference_context", "inference_weights"]


@contextlib.contextmanager
def inference_weights(
    model: torch.nn.Module, merge_adapters: bool = True, dtype: torch.dtype | None = None, pack_weights: bool = True
) -> Iterator[torch.nn.Module]:
    """Within the context, ``model``'s LoRA linear layers compute with merged weights (one matmul each).

    Each adapted layer's base weight is replaced by a new tensor ``W + delta`` (in ``dtype`` when given, e.g. bf16
    for bf16 autocast) and marked merged, so PEFT's forward uses the base layer alone. With ``dtype``, every other
    linear weight computes with a copy in ``dtype`` too (:func:`sapo.speed.precision.linear_weights_in`: autocast
    would cast a frozen weight, the tied LM head above all, at every generated token); and in bf16, with
    ``pack_weights``, each weight is packed once into oneDNN's layout
    (:func:`sapo.speed.precision.packed_bf16_linears`), which pays back over a generation's many forward passes, not
    over a single one.
    On exit the original weight objects are put back unchanged (exactly, not by subtraction) and the merge marks
    removed. No gradient flows through the swapped weights: use it for generation and forward passes without
    gradients. A model without LoRA layers, or ``merge_adapters=False``, keeps its adapters unmerged.
    """
    layers = plain_lora_linears(model) if merge_adapters else []
    swapped = []
    try:
        with torch.no_grad():
            for module, adapters in layers:
                base = module.get_base_layer()
                weight = base.weight
                # in dtype: from the frozen base's copy, cast once for the run (sapo.speed.precision), not per call
                merged = (weight.detach() if dtype is None else weight_in(weight, dtype)).clone()
                for adapter in adapters:
                    merged += module.get_delta_weight(adapter).to(merged.dtype)
                swapped.append((module, base, weight))
                base.weight = torch.nn.Parameter(merged, requires_grad=False)
                module.merged_adapters = list(adapters)
        with (
            linear_weights_in(model, dtype) if dtype is not None else contextlib.nullcontext(),
            packed_bf16_linears(model) if dtype == torch.bfloat16 and pack_weights else contextlib.nullcontext(),
        ):
            yield model
    finally:
        for module, base, weight in swapped:
            base.weight = weight
            module.merged_adapters = []


def bf16_autocast(device_type: str, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on a CPU or a CUDA GPU when ``bf16`` is set, else (or on another device) a context that does
    nothing. On both devices, so that a node scores its held-out questions in the precision it trains in and a CPU
    node and a GPU node score the same model alike (greedy answers differ between bf16 and float32)."""
    if bf16 and device_type in ("cpu", "cuda"):
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def inference_context(
    model: torch.nn.Module, merge_adapters: bool = True, bf16: bool = False, pack_weights: bool = True
) -> Iterator[None]:
    """The speed-ups of forward passes without gradients in one context: LoRA adapters merged
    (:func:`inference_weights`; on a CPU under bf16 autocast, in bf16 and packed for oneDNN with ``pack_weights``)
    and bf16 autocast on the model's device (:func:`bf16_autocast`)."""
    device_type = next(model.parameters()).device.type
    # bf16 weight copies and oneDNN packing are a CPU's speed-ups; a GPU's autocast casts per matmul itself
    dtype = torch.bfloat16 if bf16 and device_type == "cpu" else None
    weights = inference_weights(model, merge_adapters=merge_adapters, dtype=dtype, pack_weights=pack_weights)
    with weights, bf16_autocast(device_type, bf16):
        yield
