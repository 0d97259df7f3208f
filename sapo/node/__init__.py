"""The node application: `sapo-node`'s runner, options, CLI, callbacks, status, report, local swarm and eval command.

Built on the algorithm layer (`sapo.config`, `sapo.trainer`, ...), which never imports this package. Names that
`sapo.node` offered when it was one module (`NodeArguments`, `NodeError`, `run_node`, ...) stay importable from here,
lazily, so that `sapo-node report` does not pay for the runner's imports.
"""

from __future__ import annotations

from typing import Any

_RUNNER_NAMES = (
    "JoinError",
    "NodeArguments",
    "NodeError",
    "build_questions",
    "build_rewards",
    "default_task_names",
    "run_node",
    "task_specs",
)

__all__ = list(_RUNNER_NAMES)


def __getattr__(name: str) -> Any:
    if name in _RUNNER_NAMES:
        from sapo.node import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'sapo.node' has no attribute {name!r}")
