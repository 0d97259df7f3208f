"""The errors a node stops with, each with its exit code: what the user can fix, a join that failed, a limit."""

from __future__ import annotations


class NodeError(Exception):
    """A problem the user can fix (bad address, missing model, unknown task...): one line, with the fix."""

    exit_code = 2


class ErrorLimitReached(NodeError):
    """Training stopped: a reward function or a task source kept raising past its limit."""

    exit_code = 4


class JoinError(NodeError):
    """No initial peer answered."""

    exit_code = 3
