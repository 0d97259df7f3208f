"""SAPO (Swarm sAmpling Policy Optimization): GRPO on a mix of local and swarm-shared rollouts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sapo.config import SAPOConfig
    from sapo.trainer import SAPOTrainer

__all__ = ["SAPOConfig", "SAPOTrainer"]


def __getattr__(name: str) -> Any:
    # Lazy: `import sapo.node.processes` or `sapo-node report` must not pay for importing trl and transformers.
    if name == "SAPOConfig":
        from sapo.config import SAPOConfig

        return SAPOConfig
    if name == "SAPOTrainer":
        from sapo.trainer import SAPOTrainer

        return SAPOTrainer
    raise AttributeError(f"module 'sapo' has no attribute {name!r}")
