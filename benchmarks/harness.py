"""What every benchmark shares: the machine, the commit and whether the tree was clean, a process's memory, JSON."""

from __future__ import annotations

import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    """One line: host, CPUs, memory, GPU, Python."""
    memory = 0
    try:
        with open("/proc/meminfo") as f:
            memory = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:")) * 1024
    except (OSError, StopIteration):
        pass
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, {memory / 2**30:.0f} GiB, {gpu}, "
        f"Python {platform.python_version()}"
    )


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool}`` of the tree the benchmark's code was imported from."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def commit_label(root: Path = ROOT) -> str:
    """The commit as one string for a report: ``sha``, or ``sha (dirty tree)``."""
    state = git_state(root)
    return state["commit"] + (" (dirty tree)" if state["dirty"] else "")


def proc_status_kb(pid: int, key: str = "VmRSS") -> int | None:
    """A ``/proc/<pid>/status`` figure in kB (``VmRSS``: resident memory, ``VmHWM``: its peak); None if the process
    is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has neither), recursively."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
