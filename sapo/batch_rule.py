"""The batch rule of `SAPOConfig` (its docstring states it): how a round's groups, micro-batch and gradient
accumulation follow from the arguments given, and how the round splits into own groups (I) and swarm groups (J)."""

from __future__ import annotations

from typing import Any

from sapo.config_checks import check_pool_size
from sapo.speed.devices import round_micro_batch


def size_round_by_groups(config: Any, processes: int) -> None:
    """Size ``config``'s round (a `SAPOConfig` before TRL's `__post_init__`) from `num_local` and `num_external` when
    both are given and neither `generation_batch_size` nor `steps_per_generation` is: one round is one optimizer step
    over ``processes`` processes, with `per_device_train_batch_size=None` a process's share in one micro-batch
    (:func:`sapo.speed.devices.round_micro_batch`). Raises ValueError for a round that does not divide, or for
    `per_device_train_batch_size=None` without a round sized by groups."""
    sized_by_groups = config.num_local is not None and config.num_external is not None
    if sized_by_groups and config.generation_batch_size is None and config.steps_per_generation is None:
        rows = (config.num_local + config.num_external) * config.num_generations
        if config.per_device_train_batch_size is None:
            config.per_device_train_batch_size = round_micro_batch(rows, processes, config.num_generations)
        per_step = config.per_device_train_batch_size * processes
        if rows % per_step != 0:
            raise ValueError(
                f"(num_local + num_external) * num_generations = {rows} completions per round must be divisible "
                f"by per_device_train_batch_size * processes = {config.per_device_train_batch_size} * {processes}; "
                "change one of them."
            )
        config.generation_batch_size = rows
        config.gradient_accumulation_steps = rows // per_step
    if config.per_device_train_batch_size is None:
        raise ValueError(
            "per_device_train_batch_size=None (one micro-batch per round) needs the round sized by groups: give "
            "num_local and num_external, and neither generation_batch_size nor steps_per_generation; or give "
            "per_device_train_batch_size a number."
        )


def split_round(config: Any, processes: int) -> None:
    """Set ``config``'s `num_local` and `num_external` from the generation batch TRL derived where they were not
    given (the batch rule), and check them against it."""
    groups = config.generation_batch_size // config.num_generations
    if config.num_external is None and config.num_local is None:
        config.num_external = groups // 2 // processes * processes
    if config.num_external is None:
        config.num_external = groups - config.num_local
    if config.num_local is None:
        config.num_local = groups - config.num_external
    if config.num_local < 0 or config.num_external < 0 or config.num_local + config.num_external != groups:
        raise ValueError(
            f"num_local + num_external = {config.num_local} + {config.num_external} groups, but the generation batch "
            f"holds generation_batch_size / num_generations = {config.generation_batch_size} / "
            f"{config.num_generations} = {groups}; leave one of them (or generation_batch_size and "
            "steps_per_generation) unset so that it is derived."
        )
    check_pool_size(config)
