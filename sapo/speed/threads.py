"""Threads for a machine the node shares: as many as the cores this process may use, waiting without spinning.

PyTorch's CPU kernels run on OpenMP threads, by default one per core of the machine, and GNU OpenMP lets a thread
that waits for work spin for a while before it sleeps. On a machine the node has to itself that is right; beside
another busy process (a second node, an experiment, an editor), each spinning thread takes a core the other one
needs, and the node waits for its own threads to be scheduled. :func:`share_the_machine` sets, before OpenMP starts:

- ``OMP_NUM_THREADS``: the cores this process may use (:func:`usable_cores`: its CPU affinity, and a container's
  CPU quota where one is set), not every core of the host;
- ``OMP_WAIT_POLICY=PASSIVE``: a thread with nothing to do sleeps at once instead of spinning.

OpenMP reads both once, when PyTorch loads it (at ``import torch``): `sapo-node` calls :func:`share_the_machine`
first thing. A script using the library does the same before it imports torch (or sets the two variables in its
environment); called after torch is loaded, it sets the number of threads through torch, leaves the environment
alone and says that the wait policy stays what it was. A value already in the environment is kept.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

__all__ = ["cgroup_cpu_limit", "share_the_machine", "thread_environment", "usable_cores"]

logger = logging.getLogger(__name__)

PASSIVE_WAITING = {"OMP_WAIT_POLICY": "PASSIVE"}
"""The environment that makes OpenMP threads sleep while they wait (GNU and LLVM/Intel OpenMP alike)."""


def cgroup_cpu_limit(root: str | Path = "/sys/fs/cgroup") -> float | None:
    """The CPUs this process's control group may use, as a number of cores (a quota of 150 ms per 100 ms is 1.5), or
    None where no quota is set or none can be read. Reads cgroup v2's ``cpu.max``, else v1's ``cpu.cfs_quota_us``
    and ``cpu.cfs_period_us``."""
    root = Path(root)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cores(cgroup_root: str | Path = "/sys/fs/cgroup") -> int:
    """The cores this process may run on: those of its CPU affinity (`os.sched_getaffinity`; every CPU where the
    platform has none), fewer where a control-group CPU quota allows fewer (rounded up); at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup_root)
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


def thread_environment(threads: int | None = None, passive: bool = True) -> dict[str, str]:
    """The variables :func:`share_the_machine` would set, for a process that starts torch afresh: ``OMP_NUM_THREADS``
    (``threads``, default :func:`usable_cores`) and, with ``passive``, ``OMP_WAIT_POLICY=PASSIVE``, each only where
    this process's environment does not set it already. (A script that starts its workers from a fresh interpreter,
    such as multiprocessing's fork server, puts them in ``os.environ`` first.)"""
    wanted = {"OMP_NUM_THREADS": str(threads or usable_cores()), **(PASSIVE_WAITING if passive else {})}
    return {name: value for name, value in wanted.items() if name not in os.environ}


def share_the_machine(threads: int | None = None, passive: bool = True) -> dict[str, str]:
    """Set ``OMP_NUM_THREADS`` (``threads``, default :func:`usable_cores`) and, with ``passive``,
    ``OMP_WAIT_POLICY=PASSIVE`` in this process's environment, each unless already set (module docstring); returns
    what it set. Where torch is already loaded, OpenMP has read its settings: the environment is left as it is, the
    thread count is set through torch instead, and a log line says the wait policy could not change any more."""
    chosen = thread_environment(threads, passive)
    torch = sys.modules.get("torch")
    if torch is None:
        os.environ.update(chosen)
        return chosen
    if "OMP_NUM_THREADS" in chosen:
        torch.set_num_threads(int(chosen["OMP_NUM_THREADS"]))
    if "OMP_WAIT_POLICY" in chosen:
        logger.info("torch was loaded before share_the_machine(): OpenMP keeps the wait policy it started with")
    return {name: value for name, value in chosen.items() if name == "OMP_NUM_THREADS"}
