"""The clock a transport reads: wall time for record timestamps, monotonic time for intervals; injectable."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What a transport asks of a clock.

    ``time()`` is wall-clock seconds since the epoch: it dates records, which other machines compare with their own
    clocks. ``monotonic()`` measures intervals on this machine (polling, timeouts, durations) and never jumps.
    """

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for intervals on this machine."""
        ...


class SystemClock:
    """The machine's clocks: :func:`time.time` and :func:`time.monotonic`."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds of :func:`time.monotonic`."""
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that moves only when told to, so expiry, staleness and clock skew are tested without waiting.

    Both readings advance together; ``start`` is the initial wall-clock reading.
    """

    def __init__(self, start: float = 1_800_000_000.0):
        self._wall = start
        self._monotonic = 0.0

    def time(self) -> float:
        """The current wall-clock reading."""
        return self._wall

    def monotonic(self) -> float:
        """The current monotonic reading (starts at 0)."""
        return self._monotonic

    def advance(self, seconds: float) -> None:
        """Move both readings forward by ``seconds``."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back (advance({seconds}))")
        self._wall += seconds
        self._monotonic += seconds
