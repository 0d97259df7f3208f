"""A tiny, quiet SAPOTrainer run on CPU (its SAPOConfig, or the trainer itself): what the trainer tests, the testbed's
rounds and the benchmarks share."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapo.config import SAPOConfig

if TYPE_CHECKING:
    from sapo.trainer import SAPOTrainer

TINY_RUN: dict[str, Any] = dict(
    num_generations=4,
    per_device_train_batch_size=4,
    max_completion_length=8,
    report_to="none",
    save_strategy="no",
    use_cpu=True,
    seed=0,
    disable_tqdm=True,
)
"""Groups of 4 completions of at most 8 tokens, one group per micro-batch, on CPU, seed 0; no reports, checkpoints
or progress bar."""


def tiny_config(output_dir: str | Path, **fields: Any) -> SAPOConfig:
    """A SAPOConfig writing into ``output_dir`` with :data:`TINY_RUN`'s settings, ``fields`` given on top."""
    return SAPOConfig(output_dir=str(output_dir), **{**TINY_RUN, **fields})


def tiny_trainer(
    output_dir: str | Path,
    tokenizer: Any,
    reward_funcs: Sequence[Any],
    train_dataset: Any,
    swarm: Any = None,
    callbacks: Sequence[Any] | None = None,
    **fields: Any,
) -> SAPOTrainer:
    """A SAPOTrainer of a tiny random model (:func:`sapo.models.build_tiny_model`, seed 0) for ``tokenizer``, with
    :func:`tiny_config` (``fields`` on top), training on ``train_dataset`` with ``reward_funcs`` over ``swarm`` (None:
    alone); ``callbacks`` are TRL's."""
    from sapo.models import build_tiny_model
    from sapo.trainer import SAPOTrainer

    return SAPOTrainer(
        model=build_tiny_model(tokenizer, seed=0),
        reward_funcs=list(reward_funcs),
        args=tiny_config(output_dir, **fields),
        train_dataset=train_dataset,
        processing_class=tokenizer,
        swarm=swarm,
        callbacks=None if callbacks is None else list(callbacks),
    )
