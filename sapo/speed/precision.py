"""Linear weights in bf16 for CPU autocast: each cast done once instead of at every call.

Autocast casts a float32 weight to bf16 at every call of a linear layer and keeps a cast only for leaves that
require a gradient, so the frozen base weights of a LoRA model (and its tied LM head) would be cast again at every
generated token and at every forward pass of the loss. :func:`linear_weights_in` swaps each such weight for a copy
in the autocast dtype for the length of a context; the products are the ones autocast computes (its cast is the
same rounding), so results are unchanged. The copies of frozen weights are kept while the weight is alive and
unchanged (its in-place version counter), so a LoRA node casts its base model once, not once per step.
:func:`packed_bf16_linears` packs bf16 weights once into oneDNN's layout for the many forward passes of a generation.

:func:`float32_attention` runs the attention of a training pass in float32 under the same autocast: on a CPU the
bf16 backward of PyTorch's fused attention is much slower than the float32 one, and float32 is the more exact.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from sapo.speed.patch_point import attention_implementation, attention_replaced
from sapo.speed.scoped import forwards_replaced

__all__ = [
    "FLOAT32_SDPA",
    "bf16_training_pass",
    "float32_attention",
    "linear_weights_in",
    "packed_bf16_linears",
    "weight_in",
]

FLOAT32_SDPA = "sdpa_float32"
"""The name under which transformers' attention registry holds :func:`_sdpa_in_float32` within
:func:`float32_attention`."""

_FROZEN_COPIES = WeakIdKeyDictionary()
"""A frozen weight (by identity, while it lives) -> (its version when copied, its copy in the autocast dtype)."""

_PACKED = WeakIdKeyDictionary()
"""A bf16 weight that is not trained (by identity, while it lives) -> (its version when packed, its oneDNN copy)."""


def weight_in(weight: torch.Tensor, dtype: torch.dtype) -> torch.nn.Parameter:
    """``weight`` in ``dtype`` as a parameter without gradient; a frozen weight's copy is reused while unchanged."""
    if weight.requires_grad:  # trained: it changes every step
        return torch.nn.Parameter(weight.detach().to(dtype), requires_grad=False)
    cached = _FROZEN_COPIES.get(weight)
    if cached is not None and cached[0] == weight._version and cached[1].dtype == dtype:
        return cached[1]
    copy = torch.nn.Parameter(weight.detach().to(dtype), requires_grad=False)
    _FROZEN_COPIES[weight] = (weight._version, copy)
    return copy


@contextlib.contextmanager
def linear_weights_in(model: torch.nn.Module, dtype: torch.dtype, frozen_only: bool = False) -> Iterator[None]:
    """Within the context, every ``nn.Linear`` of ``model`` whose floating-point weight is in another dtype computes
    with a copy in ``dtype``; on exit the original weight objects are put back.

    Use it only under autocast to ``dtype`` (outside, a float32 input meets a bf16 weight). No gradient reaches a
    swapped weight: with ``frozen_only`` (a training pass) only weights that take no gradient are swapped, and
    autocast handles the trained ones as before; without it (generation, passes without gradients) every weight is.
    """
    swapped: list[tuple[torch.nn.Linear, torch.nn.Parameter]] = []
    try:
        with torch.no_grad():
            for linear in model.modules():
                weight = getattr(linear, "weight", None)
                if not isinstance(linear, torch.nn.Linear) or not weight.is_floating_point() or weight.dtype == dtype:
                    continue
                if frozen_only and weight.requires_grad:
                    continue
                swapped.append((linear, weight))
                linear.weight = weight_in(weight, dtype)
        yield
    finally:
        for linear, weight in reversed(swapped):
            linear.weight = weight


def _can_pack() -> bool:
    """Whether this PyTorch computes linear layers with oneDNN-packed bf16 weights on this CPU: x86 builds with mkldnn,
    on a CPU whose oneDNN has a bf16 path (AVX-512 or AMX; on an AVX2-only CPU the reorder refuses bf16)."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
        and getattr(ops, "_is_mkldnn_bf16_supported", lambda: False)()
    )


def _packed(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """``weight`` (bf16) reordered into oneDNN's blocked layout for products of about ``rows`` input rows; a weight
    that is not trained (the LM head's bf16 copy) is packed once while it is unchanged."""
    cached = _PACKED.get(weight)
    if cached is not None and cached[0] == weight._version:
        return cached[1]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)
    if not weight.requires_grad:
        _PACKED[weight] = (weight._version, packed)
    return packed


def _packed_forward(packed: torch.Tensor, bias: torch.Tensor | None) -> Any:
    def forward(input: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(input.to(torch.bfloat16), packed, bias, "none", [], "")

    return forward


@contextlib.contextmanager
def packed_bf16_linears(model: torch.nn.Module, rows: int = 8) -> Iterator[None]:
    """Within the context, each ``nn.Linear`` of ``model`` on a CPU whose weight is bf16 computes with a copy of it
    packed once into oneDNN's blocked layout, its input cast to bf16 as autocast casts it: the same products, bit
    for bit (unpacked, oneDNN reorders the weight at every call). For passes without gradients, after
    the weights were put in bf16 (:func:`linear_weights_in`, merged adapters); the layers' own forwards are back on
    exit. Where PyTorch has no oneDNN, or a layer's forward is already replaced (an accelerate hook), the layer is left
    as it is.
    """
    bf16_linears = [
        m for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.bfloat16 and m.weight.device.type == "cpu"
    ] if _can_pack() else []  # fmt: skip

    def packed_forward(linear: torch.nn.Linear) -> Any:
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        return _packed_forward(_packed(linear.weight, rows), bias)

    with forwards_replaced((linear, functools.partial(packed_forward, linear)) for linear in bf16_linears):
        yield


def _sdpa_in_float32(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' SDPA attention on float32 copies of its inputs, outside autocast; the output in the inputs'
    dtype, as the layer after it expects."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with torch.autocast(query.device.type, enabled=False):
        output, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return output.to(query.dtype), weights


@contextlib.contextmanager
def float32_attention(model: torch.nn.Module) -> Iterator[None]:
    """Within the context, a model that attends with transformers' ``"sdpa"`` attends in float32 (the rest of the
    pass keeps its autocast); any other attention implementation is left as it is. On exit the model's config says
    ``"sdpa"`` again and the float32 function is no longer in transformers' attention registries."""
    if attention_implementation(model) != "sdpa":
        yield
        return
    from transformers.masking_utils import sdpa_mask

    with attention_replaced(model, FLOAT32_SDPA, _sdpa_in_float32, sdpa_mask):  # the causal masks SDPA takes
        yield


@contextlib.contextmanager
def bf16_training_pass(model: torch.nn.Module) -> Iterator[None]:
    """A training pass under CPU bf16 autocast as `SAPOTrainer` runs it: the frozen linear weights in their bf16
    copies (:func:`linear_weights_in`) and attention in float32 (:func:`float32_attention`)."""
    with linear_weights_in(model, torch.bfloat16, frozen_only=True), float32_attention(model):
        yield
