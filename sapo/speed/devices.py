"""What depends on the machine: the device defaults of `SAPOConfig`, native bf16 on a CPU, the round's micro-batch."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AUTO",
    "DEVICE_FIELDS",
    "MAX_ROUND_MICRO_BATCH",
    "SPEEDUPS_CHOICES",
    "SPEED_UP_FIELDS",
    "cpu_has_native_bf16",
    "device_defaults",
    "fill_device_fields",
    "round_micro_batch",
]

SPEED_UP_FIELDS = (
    "generation_prefill_once",
    "generation_merge_adapters",
    "generation_inverse_transform_sampling",
    "scoring_prefill_once",
    "cpu_fused_loss_pass",
)
"""The `SAPOConfig` switches of the individual speed-ups: `None` follows `speedups` (and the device), a value set
explicitly overrides it."""

DEVICE_FIELDS = ("use_cpu", "gradient_checkpointing", "bf16", *SPEED_UP_FIELDS)
"""Every `SAPOConfig` field whose `None` is decided on the machine that runs (:func:`device_defaults`)."""

SPEEDUPS_CHOICES = ("auto", "off")
"""The values of `SAPOConfig.speedups`."""

AUTO = "auto"
"""How a configuration file or a flag leaves a field of :data:`DEVICE_FIELDS` to the machine that runs (`None`)."""

MAX_ROUND_MICRO_BATCH = 16
"""The most rows `per_device_train_batch_size=None` puts in one micro-batch (:func:`round_micro_batch`)."""


def device_defaults() -> dict[str, bool]:
    """What `SAPOConfig`'s device-dependent fields become when left at `None`, on this machine, with
    `speedups="auto"`.

    With a CUDA GPU: the GPU, activation (gradient) checkpointing on, bf16 autocast where the GPU supports it
    natively. Without one: the CPU, checkpointing off (it saves memory by recomputing activations, a pure loss of
    time on a CPU), bf16 autocast where the CPU computes bf16 natively (:func:`cpu_has_native_bf16`; emulated in
    software it is much slower than float32). The speed-ups (:data:`SPEED_UP_FIELDS`): generation with each prompt
    prefilled once and LoRA adapters merged on both; inverse-transform sampling and the fused loss pass wherever the
    model runs on a CPU; the loss pass with each prompt run once on a CPU only (a GPU keeps TRL's pass).
    """
    import torch

    gpu = torch.cuda.is_available()
    return {
        "use_cpu": not gpu,
        "gradient_checkpointing": gpu,
        "bf16": torch.cuda.is_bf16_supported() if gpu else cpu_has_native_bf16(),
        "generation_prefill_once": True,
        "generation_merge_adapters": True,
        "generation_inverse_transform_sampling": True,
        "scoring_prefill_once": not gpu,
        "cpu_fused_loss_pass": True,
    }


def fill_device_fields(config: Any, device: dict[str, bool]) -> None:
    """Fill ``config``'s device-dependent fields still at `None` from ``device`` (:func:`device_defaults`' answer),
    and the speed-ups' switches from its `speedups` (off: `False`); explicit values stay. Raises ValueError for an
    unknown `speedups`."""
    if config.speedups not in SPEEDUPS_CHOICES:
        raise ValueError(f"speedups={config.speedups!r} is unknown; choose one of {list(SPEEDUPS_CHOICES)}.")
    if config.use_cpu is None:
        config.use_cpu = device["use_cpu"]
    if config.bf16 is None and not config.fp16:
        config.bf16 = device["bf16"]
    for name in SPEED_UP_FIELDS:
        if getattr(config, name) is None:
            setattr(config, name, device[name] if config.speedups == "auto" else False)
    if config.gradient_checkpointing is None and getattr(config, "activation_checkpointing", None) is None:
        # transformers 5 renamed it activation_checkpointing and mirrors the old name after __post_init__;
        # setting the new name spares a deprecation warning.
        name = "activation_checkpointing" if hasattr(config, "activation_checkpointing") else "gradient_checkpointing"
        setattr(config, name, device["gradient_checkpointing"])


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes bf16 matrix products in hardware: an `avx512_bf16` or `amx_bf16` flag in
    `/proc/cpuinfo` (Linux; False where the file cannot be read)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def round_micro_batch(rows: int, processes: int, num_generations: int, largest: int = MAX_ROUND_MICRO_BATCH) -> int:
    """The micro-batch of `per_device_train_batch_size=None`: a process's whole share of a round of ``rows``
    completions, so that each group's rows share a micro-batch (its prompt then runs once in the loss pass:
    `scoring_prefill_once`); a larger share is split into the most rows up to ``largest`` that divide it, whole
    groups where possible, to bound the pass's memory."""
    share = max(rows // processes, 1)
    divisors = [d for d in range(1, min(share, largest) + 1) if share % d == 0]
    whole_groups = [d for d in divisors if d % num_generations == 0]
    return max(whole_groups or divisors)
