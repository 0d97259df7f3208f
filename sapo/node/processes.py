"""Stopping the child processes a launcher started: SIGTERM, a grace period, then SIGKILL, by PID."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence


def stop_processes(processes: Sequence[subprocess.Popen], grace: float) -> list[int | None]:
    """Ask every running process to stop (SIGTERM), wait up to ``grace`` seconds for each, then kill the rest.

    Returns the exit codes in order. Processes that already exited are left as they are.
    """
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return [process.returncode for process in processes]
