"""Ending the `sapo-node` process promptly: a stop before the node has started, and the exit once it has finished."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn

EXIT_TIMEOUT = 2.0
"""Seconds :func:`exit_process` allows the exit handlers and the threads left running before it exits regardless."""


def stop_before_start() -> None:
    """Make SIGTERM end the process at once with code 0 until the node installs its own handlers (its imports take
    seconds): nothing is written before then that a stop could leave half done. Main thread only."""
    signal.signal(signal.SIGTERM, _exit_before_start)


def _exit_before_start(signum: int, frame: Any) -> None:
    print(f"sapo-node: {signal.Signals(signum).name} received while starting: exiting", file=sys.stderr, flush=True)
    exit_process(0)


def exit_process(code: int, timeout: float = EXIT_TIMEOUT) -> NoReturn:
    """End this process with ``code`` once the node is done: its checkpoint written, the swarm left, the logs closed.

    Runs what a normal exit runs that matters (the threads still running are joined, the exit handlers the
    libraries registered run: a helper child stopped, temporary files removed; every log handler and stream is
    flushed), then leaves without the interpreter's own teardown, whose final garbage collection of a loaded model
    and its libraries takes seconds (over 10 s on a busy machine: past `docker stop`'s default grace). Whatever of
    that still runs after ``timeout`` seconds is abandoned: the process exits with ``code`` anyway. Further SIGTERM
    and SIGINT are ignored (the node is already stopping). Main thread only.
    """
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    deadline = time.monotonic() + timeout
    threading.Thread(target=_exit_at, args=(deadline, code), name="exit-deadline", daemon=True).start()
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None:  # its exit handler only logs a table of compile times at INFO, taking seconds to build it
        atexit.unregister(dynamo.dump_compile_times)
    try:
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(code)


def _exit_at(deadline: float, code: int) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))
    print("sapo-node: exit handlers still running; exiting without them", file=sys.stderr)
    _flush()
    os._exit(code)


def _flush() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to keep
            pass
