"""SAPO (Swarm sAmpling Policy Optimization): GRPO on a mix of local and swarm-shared rollouts."""

from sapo.config import SAPOConfig
from sapo.trainer import SAPOTrainer

__all__ = ["SAPOConfig", "SAPOTrainer"]
