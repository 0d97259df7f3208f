"""Hygiene of the p2pd daemons hivemind starts: liveness checks, stale sockets, leftovers of crashed runs."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import glob
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

STATE_FILE = "p2pd-state.json"
"""Name of the file in a peer's state directory recording its p2pd (pid and start time), its Python pid and its
sockets."""


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (field 22 of ``/proc/PID/stat``); None if none runs."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ProcessIdentity:
    """One process: its pid and its start time. A pid is reused once its process is gone (within minutes on a busy
    machine); the pair names one process, so a process that merely got the same pid is never taken for it."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The process that has ``pid`` now; None if none has it. Call it while the process certainly runs (e.g.
        right after starting it): later, the pid may belong to another process."""
        start = start_time(pid)
        return None if start is None else cls(pid, start)

    def running(self) -> bool:
        """True while this very process runs (not a zombie)."""
        return pid_alive(self.pid) and start_time(self.pid) == self.start

    def kill(self, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` to this process if it still runs, never to another that reused its pid; True if sent.

        The pid is pinned by a pidfd before the start time is compared, so the check and the signal concern the
        same process."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError as e:
            # gone; or no pidfd to be had (out of file descriptors, a platform without them): never signal on a guess
            return _not_signalled(self, e)
        try:
            if start_time(self.pid) != self.start:
                return False
            signal.pidfd_send_signal(fd, sig)
            return True
        except OSError as e:
            return _not_signalled(self, e)
        finally:
            os.close(fd)


def _not_signalled(process: ProcessIdentity, error: OSError) -> bool:
    """False; a reason other than the process being gone is logged (it leaves a process running)."""
    if error.errno != errno.ESRCH:
        logger.warning("could not signal process %d: %s", process.pid, error)
    return False


def is_p2pd(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"p2pd" in f.read()
    except OSError:
        return False


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def socket_is_stale(path: str) -> bool:
    """True if nobody listens on the unix socket ``path`` any more."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
            return False
        except (ConnectionRefusedError, FileNotFoundError):
            return True
        except OSError:
            return False


def remove_files(paths: Sequence[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def bound_unix_paths() -> set[str]:
    """The paths of the unix sockets bound now in this network namespace (``/proc/net/unix``): each is held open by
    a live process, whether or not it listens yet."""
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            return {fields[7] for line in f if len(fields := line.split()) >= 8}
    except OSError:
        return set()


def remove_stale_sockets_since(since: float) -> None:
    """Remove hivemind socket files created after ``since`` that no process holds.

    A p2pd that exits during startup (e.g. no bootstrap peer answered) leaves its socket file, and hivemind never
    tells us its name; a socket nobody holds is garbage whoever made it. One that refuses connections may merely be
    starting (bound, not yet listening: another peer's, of this program or another): it is left while it is bound.
    """
    bound = bound_unix_paths()
    for path in glob.glob("/tmp/hivemind-p2pd-*.sock") + glob.glob("/tmp/hivemind-p2pclient-*.sock"):
        try:
            if os.stat(path).st_mtime >= since - 1 and path not in bound and socket_is_stale(path):
                os.remove(path)
        except OSError:
            pass


def cleanup_stale_state(state_dir: str) -> None:
    """Kill a p2pd left by a crashed previous run with this ``state_dir`` and remove its socket files.

    The p2pd is killed only if the very process recorded still runs (its pid and start time, against pid reuse),
    is a p2pd, and its recorded Python parent is gone. A state file without the start time (written before it was
    recorded) never leads to a kill.
    """
    path = os.path.join(state_dir, STATE_FILE)
    try:
        with open(path) as f:
            state = json.load(f)
        pid, parent = int(state["p2pd_pid"]), int(state["python_pid"])
        start = state.get("p2pd_start")
        daemon = ProcessIdentity(pid, int(start)) if start is not None else None
        sockets = [str(s) for s in state.get("sockets", [])]
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("ignoring unreadable state file %s: %s", path, e)
        remove_files([path])
        return
    if daemon is not None and daemon.running() and is_p2pd(pid):
        if parent_pid(pid) == parent and pid_alive(parent):
            logger.warning("p2pd %d from %s still belongs to live process %d; leaving it", pid, path, parent)
            return
        logger.warning("killing p2pd %d left behind by a previous run (parent %d is gone)", pid, parent)
        daemon.kill()
        deadline = time.monotonic() + 5
        while daemon.running() and time.monotonic() < deadline:
            time.sleep(0.05)
    remove_files([s for s in sockets if os.path.exists(s) and socket_is_stale(s)])
    remove_files([path])


async def close_p2p(p2p: Any) -> None:
    """Shut down a hivemind ``P2P`` (its p2pd daemon) and close everything of it that lives on the running loop.

    hivemind cancels its control client's connection tasks without awaiting them and leaves the daemon's subprocess
    transport open; left to the garbage collector after the loop closed, both raise "Event loop is closed". Call
    this while the loop still runs.
    """
    from swarm.hivemind_bridge import release_loop_resources  # here: the rest of this module needs no hivemind

    with contextlib.suppress(Exception):
        await asyncio.wait_for(p2p.shutdown(), 10)
    await release_loop_resources(p2p)


def close_stopped_loop(loop: asyncio.AbstractEventLoop, timeout: float = 5.0) -> None:
    """Close an event loop that no thread runs any more, after finishing everything that still needs it.

    Tasks left pending (hivemind's connection readers and writers, fire-and-forget pings) are cancelled and run to
    their end, and objects nobody references any more (e.g. the subprocess transport of a p2pd whose start failed)
    are collected while the loop can still run their cleanup callbacks. Otherwise the garbage collector destroys
    them later, at an arbitrary moment of another test or job, and their cleanup raises "Event loop is closed".
    """
    if loop.is_closed() or loop.is_running():
        return
    with contextlib.suppress(Exception):
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=timeout))
        gc.collect()  # finalizers of unreachable transports schedule their callbacks on this loop...
        loop.run_until_complete(asyncio.sleep(0))  # ...which run here, while the loop is open
        loop.run_until_complete(loop.shutdown_asyncgens())
    with contextlib.suppress(Exception):
        loop.close()
