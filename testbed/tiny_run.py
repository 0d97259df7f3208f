"""The SAPOConfig of a tiny, quiet SAPOTrainer run on CPU: what the trainer tests and the testbed's rounds share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sapo.config import SAPOConfig

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
