"""The CPU and GPU speed-ups of SAPOTrainer and the defaults that depend on the machine.

`SpeedUps` (in :mod:`sapo.speed.speed_ups`) is the one surface the trainer calls: built from a `SAPOConfig`
(`speedups="auto"` or `"off"`, each speed-up's own switch overriding it), it gives the contexts in which TRL's
generation, TRL's loss pass and the passes without gradients run. Every speed-up is applied inside a context that
puts back what it replaced (:mod:`sapo.speed.scoped`): nothing stays installed after the call that needed it.

- :mod:`sapo.speed.devices`: the device defaults, native bf16 on a CPU, the round's micro-batch.
- :mod:`sapo.speed.generation`: each prompt prefilled once; :mod:`sapo.speed.sampling`: inverse-transform sampling.
- :mod:`sapo.speed.inference`: LoRA adapters merged, bf16 weights cast once and packed, for passes without gradients.
- :mod:`sapo.speed.precision`: bf16 weight copies, oneDNN packing and float32 attention under CPU autocast.
- :mod:`sapo.speed.lora_layers`, :mod:`sapo.speed.lm_head`, :mod:`sapo.speed.shared_prompts`: the CPU loss pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sapo.speed.speed_ups import SpeedUps

__all__ = ["SpeedUps"]


def __getattr__(name: str) -> Any:
    # Lazy: `sapo.config` reads the device defaults without importing the speed-ups (torch, trl, transformers).
    if name == "SpeedUps":
        from sapo.speed.speed_ups import SpeedUps

        return SpeedUps
    raise AttributeError(f"module 'sapo.speed' has no attribute {name!r}")
