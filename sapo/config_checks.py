"""The checks of SAPOConfig's own fields: a bad value raises one ValueError naming the field and what it takes."""

from __future__ import annotations

from typing import Any

from sapo.sources.base import SOURCE_POLICIES

REPLAY_CHOICES = ("off", "fill", "only")
"""The values of `SAPOConfig.replay`."""


def _count_at_least(value: Any, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_sapo_fields(config: Any) -> None:
    """Check ``config``'s SAPO fields (a `SAPOConfig`, before its round is sized): a ValueError names the first bad
    one, what it got and what it takes."""
    for name in ("num_local", "num_external"):
        value = getattr(config, name)
        if value is not None and not _count_at_least(value, 0):
            raise ValueError(f"{name} must be a non-negative integer or None (derived), got {value!r}.")
    if config.num_local == 0 and config.num_external == 0:
        raise ValueError("num_local + num_external must be at least 1: a round needs at least one group.")
    if config.num_generations is None or config.num_generations < 2:
        raise ValueError(
            f"num_generations must be at least 2 (advantages are computed within a group), "
            f"got {config.num_generations!r}."
        )
    if config.replay not in REPLAY_CHOICES:
        raise ValueError(f"replay={config.replay!r} is unknown; choose one of {list(REPLAY_CHOICES)}.")
    for name in ("replay_max_age", "replay_max_uses"):
        value = getattr(config, name)
        if not _count_at_least(value, 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if config.external_source_policy not in SOURCE_POLICIES:
        raise ValueError(
            f"external_source_policy={config.external_source_policy!r} is unknown; "
            f"choose one of {list(SOURCE_POLICIES)}."
        )
    check_pool_size(config)
    if config.max_groups_per_peer is not None and config.max_groups_per_peer < 1:
        raise ValueError(f"max_groups_per_peer must be at least 1 or None, got {config.max_groups_per_peer}.")
    if config.external_max_question_chars is not None and not _count_at_least(config.external_max_question_chars, 1):
        raise ValueError(
            f"external_max_question_chars must be a positive whole number or None, got "
            f"{config.external_max_question_chars!r}."
        )
    if config.regeneration_timeout is not None and config.regeneration_timeout <= 0:
        raise ValueError(f"regeneration_timeout must be positive or None, got {config.regeneration_timeout}.")
    if config.regeneration_budget is not None and not config.regeneration_budget > 0:
        raise ValueError(
            f"regeneration_budget must be positive seconds or None (no budget), got {config.regeneration_budget}."
        )
    for name in ("sender_rederivation_seconds", "newcomer_rederivation_seconds"):
        seconds = getattr(config, name)
        if seconds is not None and not seconds > 0:
            raise ValueError(f"{name} must be positive seconds or None (no rest), got {seconds}.")
    if config.eval_questions < 1:
        raise ValueError(f"eval_questions must be at least 1, got {config.eval_questions}.")
    if not _count_at_least(config.swarm_hold, 0):
        raise ValueError(
            f"swarm_hold must be a non-negative integer (0: keep no unchosen group), got {config.swarm_hold!r}."
        )
    if config.max_group_age is not None and config.max_group_age <= 0:
        raise ValueError(f"max_group_age must be positive or None, got {config.max_group_age}.")
    if config.plausibility_margin is not None and config.plausibility_margin < 0:
        raise ValueError(f"plausibility_margin must be >= 0 nats or None (no check), got {config.plausibility_margin}.")
    if config.plausibility_span_margin is not None and config.plausibility_span_margin < 0:
        raise ValueError(
            f"plausibility_span_margin must be >= 0 nats or None (no span test), got {config.plausibility_span_margin}."
        )
    for name in ("external_token_floor_before", "external_token_floor_after"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name} must be >= 0 tokens, got {getattr(config, name)}.")
    if config.plausibility_span_tokens < 1:
        raise ValueError(f"plausibility_span_tokens must be at least 1, got {config.plausibility_span_tokens}.")
    if config.plausibility_window < 4:
        raise ValueError(f"plausibility_window must be at least 4 own completions, got {config.plausibility_window}.")


def check_pool_size(config: Any) -> None:
    """Check that ``config``'s `external_pool_size` (when given) holds at least its `num_external` groups."""
    if None not in (config.external_pool_size, config.num_external) and config.external_pool_size < config.num_external:
        raise ValueError(
            f"external_pool_size={config.external_pool_size} must be at least num_external={config.num_external}."
        )
