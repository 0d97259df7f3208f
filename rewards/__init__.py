"""Reward functions with TRL's signature ``fn(prompts, completions, **columns) -> list[float | None]``.

Usable in SAPO nodes and in a plain ``trl.GRPOTrainer`` alike; this package needs neither trl nor
transformers.
"""

from rewards.combine import RewardFunc, combine_rewards, weighted
from rewards.extract import ANSWER_BLOCK, completion_text, extract_answer, final_answer, strip_think
from rewards.functions import (
    format_reward,
    get_reasoning_gym_scorer,
    harden_reasoning_gym,
    math_answers_match,
    math_reward,
    reasoning_gym_reward,
    score_reasoning_gym_answer,
)

__all__ = [
    "ANSWER_BLOCK",
    "RewardFunc",
    "combine_rewards",
    "completion_text",
    "extract_answer",
    "final_answer",
    "format_reward",
    "get_reasoning_gym_scorer",
    "harden_reasoning_gym",
    "math_answers_match",
    "math_reward",
    "reasoning_gym_reward",
    "score_reasoning_gym_answer",
    "strip_think",
    "weighted",
]
