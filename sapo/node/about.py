"""Who a node is: the installed software's version and the name of the policy it trains."""

from __future__ import annotations

DISTRIBUTION = "sapo-swarm"


def sapo_version() -> str:
    """The installed version of the sapo-swarm distribution, or ``"unknown"`` when it is not installed (a source
    tree on ``PYTHONPATH``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def model_label(model: str) -> str:
    """The policy's name as a node shows it: the default model's name, or the directory given."""
    from sapo.models import DEFAULT_MODEL_NAME

    return DEFAULT_MODEL_NAME if model == "default" else model
