"""The speed-ups' patch point: every private name of TRL and transformers that `sapo.speed` replaces for one context.

Beside `sapo/trl_bridge.py` (TRL's private methods the trainer overrides or calls), this is the one other module that
names them, so that a TRL or transformers upgrade is these two modules' work. Each replacement lasts one context
(:mod:`sapo.speed.scoped`). Tested with TRL 1.16 and transformers 5 (`pyproject.toml` pins both); what each private
name is relied on for:

- `trl.trainer.utils._ChunkedLogProbFunction`: the autograd function TRL's fused LM head applies to compute per-token
  log-probabilities and entropies tile by tile, with `apply(hidden, weight, bias, targets, temperature, chunk_size,
  final_logit_softcapping, logit_scale, outputs)`; read by name at each call (:func:`trl_chunked_log_prob`).
- `trl.trainer.utils._use_triton(device) -> bool`: read by TRL's fused forward for one choice alone, whether to score
  only the completion positions (its Triton path's layout) or every position (:func:`trl_completion_positions_only`).
- `PreTrainedConfig._attn_implementation`: the name of the attention function a model's layers look up in
  transformers' registry at each forward (a property that sets the sub-configs too) (:func:`attention_implementation`,
  :func:`attention_replaced`).
- `AttentionInterface._global_mapping`, `AttentionMaskInterface._global_mapping`: transformers' registries of attention
  and mask functions by name; `register` adds to them and nothing public removes (:func:`attention_replaced`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from sapo.speed.scoped import attribute_replaced, entry_added

__all__ = ["attention_implementation", "attention_replaced", "trl_chunked_log_prob", "trl_completion_positions_only"]


@contextlib.contextmanager
def trl_chunked_log_prob(wrap: Callable[[Any], Any]) -> Iterator[None]:
    """Within the context, TRL's fused LM head applies ``wrap(TRL's function)`` in place of TRL's function, which is
    back on exit."""
    import trl.trainer.utils as trl_utils

    with attribute_replaced(trl_utils, "_ChunkedLogProbFunction", wrap(trl_utils._ChunkedLogProbFunction)):
        yield


@contextlib.contextmanager
def trl_completion_positions_only() -> Iterator[None]:
    """Within the context, TRL's fused LM head scores only the completion positions on every device, as it does with
    Triton (the kernels keep their own choice); TRL's choice is back on exit."""
    import trl.trainer.utils as trl_utils

    with attribute_replaced(trl_utils, "_use_triton", lambda device: True):
        yield


def attention_implementation(model: Any) -> str | None:
    """The name of the attention function ``model``'s layers use (e.g. ``"sdpa"``); None for a model without a
    transformers config."""
    config = getattr(model, "config", None)
    return None if config is None else getattr(config, "_attn_implementation", None)


@contextlib.contextmanager
def attention_replaced(
    model: Any, name: str, attention: Callable[..., Any], mask: Callable[..., Any]
) -> Iterator[None]:
    """Within the context, ``model`` attends with ``attention`` and builds its masks with ``mask``, both registered
    in transformers' registries as ``name``; on exit the model's config names its own again and ``name`` is no longer
    registered (a name already registered is left as it is)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    with (
        entry_added(AttentionInterface._global_mapping, name, attention),
        entry_added(AttentionMaskInterface._global_mapping, name, mask),
        attribute_replaced(model.config, "_attn_implementation", name),
    ):
        yield
