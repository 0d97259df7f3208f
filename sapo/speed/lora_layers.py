"""PEFT's plain LoRA linear layers: which they are, and a training forward that adds the adapter inside one matmul.

PEFT computes a LoRA layer as ``base(x) + lora_B(lora_A(dropout(x))) * scaling``: after the base product, a
multiplication and an addition over the whole output (rows x out_features), and in the backward pass the
multiplication again. :func:`fused_lora_forward` computes the same sum as ``addmm(base(x), lora_A(x), (B *
scaling)^T)``: the scaling moves onto the small B matrix (out_features x r) and the addition into the matmul's
accumulator, which pays on a CPU, where such elementwise passes over activations cost as much as small matmuls. The
values are PEFT's up to rounding (exactly, in float32 with a power-of-two scaling).
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

import torch

from sapo.speed.scoped import forwards_replaced

__all__ = ["fused_lora_forward", "plain_lora_linears"]


def plain_lora_linears(model: torch.nn.Module) -> list[tuple[Any, list[str]]]:
    """(layer, its active adapters) for each plain LoRA linear layer of a PEFT model whose adapters are active and not
    merged; DoRA and other variants, and adapters with a bias, are left to PEFT's own forward pass."""
    try:
        from peft.tuners.lora import Linear as LoraLinear
    except ImportError:  # PEFT not installed: no adapters
        return []
    layers = []
    for module in model.modules():
        if not isinstance(module, LoraLinear) or module.disable_adapters or module.merged:
            continue
        adapters = [a for a in module.active_adapters if a in module.lora_A]
        if adapters and not any(a in module.lora_variant or module.lora_bias[a] for a in adapters):
            layers.append((module, adapters))
    return layers


def _fusable(module: Any, adapters: list[str]) -> bool:
    """One adapter, no dropout (identity, or off), a plain `nn.Linear` base in (in, out) layout."""
    if len(adapters) != 1 or module.fan_in_fan_out or not isinstance(module.get_base_layer(), torch.nn.Linear):
        return False
    dropout = module.lora_dropout[adapters[0]]
    return isinstance(dropout, torch.nn.Identity) or (isinstance(dropout, torch.nn.Dropout) and dropout.p == 0)


def _fused(module: Any, adapter: str) -> Any:
    """``module``'s forward computing ``base(x) + x A^T (scaling B)^T`` with one addmm; PEFT's own forward for a call
    it does not cover (an `adapter_names` batch, or weights of another dtype than the input outside autocast)."""
    peft_forward = module.forward

    def forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        lora_a, lora_b = self.lora_A[adapter].weight, self.lora_B[adapter].weight
        autocast = torch.is_autocast_enabled(x.device.type)
        if args or kwargs or (not autocast and x.dtype != lora_a.dtype):
            return peft_forward(x, *args, **kwargs)
        result = self.base_layer(x)
        down = torch.nn.functional.linear(x, lora_a)
        shape = result.shape
        fused = torch.addmm(result.reshape(-1, shape[-1]), down.reshape(-1, down.shape[-1]),
                            (lora_b * self.scaling[adapter]).t())  # fmt: skip
        return fused.view(shape)

    return types.MethodType(forward, module)


@contextlib.contextmanager
def fused_lora_forward(model: torch.nn.Module) -> Iterator[None]:
    """Within the context, each plain LoRA linear layer of ``model`` with one adapter and no dropout computes its
    output with the adapter's product added inside one matmul (module docstring); gradients reach the adapters as
    through PEFT's forward. The layers' own forwards are back on exit (`sapo.speed.scoped.forwards_replaced`)."""
    fusable = [(module, adapters[0]) for module, adapters in plain_lora_linears(model) if _fusable(module, adapters)]
    # a layer whose forward a hook replaced is left to it
    with forwards_replaced((module, functools.partial(_fused, module, adapter)) for module, adapter in fusable):
        yield
