"""What every benchmark shares: the run record (machine, commit, dirty tree), /proc readings, stopping, reports."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarm.daemon import ProcessIdentity

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------------
# the run record


def meminfo_bytes(key: str = "MemTotal") -> int:
    """A ``/proc/meminfo`` figure in bytes (``MemTotal``, ``MemAvailable``); 0 if unreadable."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) * 1024
    except (OSError, StopIteration):
        return 0


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name and whether it computes bf16 natively, e.g. ``AMD EPYC (native bf16: no)``: a seed is
    another draw on another CPU model, so runs compared within a seed must share this."""
    from sapo.speed.devices import cpu_has_native_bf16

    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open(cpuinfo) as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    return f"{name} (native bf16: {'yes' if cpu_has_native_bf16(cpuinfo) else 'no'})"


def machine() -> str:
    """One line: host, CPU model, CPUs, memory, GPU, Python."""
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return (
        f"{platform.node()} {platform.machine()}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"{meminfo_bytes() / 2**30:.0f} GiB, {gpu}, Python {platform.python_version()}"
    )


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool}`` of the tree the benchmark's code was imported from. A copy without
    ``.git`` (a device machine's) names its commit with ``SAPO_GIT_COMMIT``, reported as such. Changes under
    ``benchmarks/results/`` do not make the tree dirty: they are outputs (a resumable benchmark rewrites its report
    after each run), not the code the next run executes."""
    if not (root / ".git").exists():
        commit = os.environ.get("SAPO_GIT_COMMIT")
        return {"commit": f"{commit} (copy without .git)" if commit else "unrecorded (no .git)", "dirty": False}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root).stdout.strip()

    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed)}


def code_label(state: dict[str, Any], length: int | None = None) -> str:
    """A :func:`git_state` as one string for a report: ``sha`` or ``sha (dirty tree)``, the sha cut to ``length``."""
    return str(state.get("commit", "unrecorded"))[:length] + (" (dirty tree)" if state.get("dirty") else "")


def commit_label(root: Path = ROOT) -> str:
    """The commit of this tree as one string for a report: ``sha``, or ``sha (dirty tree)``."""
    return code_label(git_state(root))


def utc_now() -> str:
    """The date and time now, UTC, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@contextlib.contextmanager
def base_worktree(base: str) -> Iterator[Path]:
    """A detached ``git worktree`` of commit ``base`` in a temporary directory, removed on exit: a base commit's code
    to run beside this tree's (a child process started in it imports the base's packages)."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), base], cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True)


def run_record(command: str | None = None) -> dict[str, str]:
    """What every report names: ``command`` (default: this process's), ``git_commit``, ``date`` and ``machine``."""
    return {
        "command": command or " ".join([os.path.basename(sys.executable), *sys.argv]),
        "git_commit": commit_label(),
        "date": utc_now(),
        "machine": machine(),
    }


def record_lines(record: dict[str, Any]) -> list[str]:
    """A result page's lines naming its :func:`run_record`: the command, then the commit, date and machine."""
    return [
        f"Command: `{record['command']}`  ",
        f"Commit: `{record['git_commit']}`, {record['date']}, {record['machine']}  ",
    ]


# ------------------------------------------------------------------------------------------------
# /proc readings


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


def rss_mb(pid: int, key: str = "VmRSS") -> float | None:
    """Resident memory of ``pid`` in MB (2**20 bytes; ``key="VmHWM"``: its peak); None if the process is gone."""
    kb = proc_status_kb(pid, key)
    return None if kb is None else kb / 1024


def _proc_stat(path: str) -> list[str] | None:
    """The fields of a ``/proc/.../stat`` file after the command name (field 3 onwards); None if gone."""
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of a process (or of one of its threads); 0 if gone."""
    fields = _proc_stat(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat")
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15 of stat)


def children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _proc_stat(f"/proc/{entry}/stat")
            if fields is not None and int(fields[1]) == pid:
                out.append(int(entry))
    return out


# ------------------------------------------------------------------------------------------------
# stopping


def stop_processes(
    processes: Sequence[subprocess.Popen], grace: float = 30.0, daemons: Iterable[ProcessIdentity] = ()
) -> list[int | None]:
    """Stop what a benchmark started, by PID: SIGTERM to every running process, SIGKILL to those still running
    ``grace`` seconds later, then SIGKILL to the p2pd daemons they leave behind (their p2pd children, and the
    ``daemons`` given, each by its pid and start time: a pid reused meanwhile names another process). Returns the
    exit codes in order."""
    from sapo.node.processes import stop_processes as terminate
    from swarm.daemon import ProcessIdentity, is_p2pd

    children_now = (ProcessIdentity.of(pid) for p in processes for pid in children(p.pid) if is_p2pd(pid))
    leftovers = [*daemons, *(d for d in children_now if d is not None)]
    codes = terminate(processes, grace)
    for daemon in leftovers:
        daemon.kill()  # only the very daemon: nothing if it is gone, whoever has its pid now
    return codes


# ------------------------------------------------------------------------------------------------
# reports


def split_at_double_dash(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` cut at its first ``--``: (the script's own arguments, what follows for another program)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has neither), recursively."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_report(out_dir: Path, stem: str, data: dict[str, Any], lines: Sequence[str]) -> dict[str, Path]:
    """Write ``<stem>.json`` (``data``, NaN as null) and ``<stem>.md`` (``lines``) into ``out_dir``; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md"}
    paths["json"].write_text(json.dumps(json_safe(data), indent=1, default=str) + "\n")
    paths["md"].write_text("\n".join(lines) + "\n")
    return paths


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (nearest rank); None when empty."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summary(values: list[float]) -> dict[str, float | None]:
    """Median, 95th percentile and count of ``values``."""
    return {"median": statistics.median(values) if values else None, "p95": percentile(values, 0.95), "n": len(values)}


def quarter_growth_per_hour(points: list[tuple[float, float]]) -> tuple[float | None, float | None, float | None]:
    """(median of the 2nd quarter, median of the last quarter, growth per hour between them) of (seconds, value)
    points. Medians, not a fitted slope: RSS is a sawtooth (allocator, GC) whose phase would tilt a fit; the first
    quarter is left out as warm-up (model load, first checkpoint)."""
    if len(points) < 8:
        return None, None, None
    n = len(points)
    q2, q4 = points[n // 4 : n // 2], points[3 * n // 4 :]
    m2, m4 = statistics.median(v for _, v in q2), statistics.median(v for _, v in q4)
    hours = (statistics.median(t for t, _ in q4) - statistics.median(t for t, _ in q2)) / 3600
    return m2, m4, (m4 - m2) / hours if hours > 0 else None
