"""Loaded by every Python process the profiled suite starts (benchmarks.suite_profile puts this folder first on
PYTHONPATH): at exit the process appends its CPU, its arguments and the test that started it to
``$SUITE_PROFILE_LOG.procs``. A process forked from a warm server runs the server's exit handlers, so it is counted
too, with its own CPU since the fork; one that ends by a signal or ``os._exit`` is not."""

import atexit
import json
import os
import resource
import sys

_LOG = os.environ.get("SUITE_PROFILE_LOG")


def _record() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {
        "pid": os.getpid(),
        "argv": sys.argv[:4],
        "test": os.environ.get("PYTEST_CURRENT_TEST"),
        "cpu": usage.ru_utime + usage.ru_stime,
    }
    try:
        with open(f"{_LOG}.procs", "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError:
        pass


if _LOG:
    atexit.register(_record)
