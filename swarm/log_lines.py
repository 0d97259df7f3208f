"""Log lines about individual peers, bounded in number: identities cost a peer nothing, so a line each is not."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

PEER_LINES_EVERY = 60.0
"""Seconds of a window in which at most :data:`PEER_LINES_BURST` lines of one kind about single peers are logged."""
PEER_LINES_BURST = 10
"""Lines of one kind about single peers (a peer found, back, dropped) logged per window; the others are counted."""


@dataclass
class _Kind:
    window_start: float
    logged: int = 0  # lines of this kind logged in the window
    left_out: int = 0  # lines of this kind not logged since the last one that was


class PeerLines:
    """Logs at most ``burst`` lines of one kind (a peer found, back, dropped) every ``interval`` seconds; the lines
    left out are counted, and the next line of that kind says how many. One peer making fresh identities (each found,
    each dropped when it goes silent) would otherwise write a line for each, filling the node's log and rotating its
    history away; what the lines report is counted in the transport's counters all the same.

    Args:
        logger: where the lines go.
        clock: monotonic seconds.
        interval: seconds of one window (default :data:`PEER_LINES_EVERY`, 60).
        burst: lines of one kind logged per window (default :data:`PEER_LINES_BURST`, 10).
    """

    def __init__(
        self,
        logger: logging.Logger,
        clock: Callable[[], float],
        interval: float = PEER_LINES_EVERY,
        burst: int = PEER_LINES_BURST,
    ):
        if interval <= 0 or burst < 1:
            raise ValueError(f"PeerLines needs interval > 0 and burst >= 1 (got {interval}, {burst})")
        self.logger, self.interval, self.burst, self._clock = logger, interval, burst, clock
        self._kinds: dict[str, _Kind] = {}
        self._lock = threading.Lock()

    def log(self, level: int, kind: str, message: str, *args: object) -> bool:
        """Log ``message % args`` at ``level`` unless ``burst`` lines of ``kind`` were logged in this window; whether
        it was. A line after some were left out ends with their number."""
        now = self._clock()
        with self._lock:
            state = self._kinds.setdefault(kind, _Kind(window_start=now))
            if now - state.window_start >= self.interval or now < state.window_start:
                state.window_start, state.logged = now, 0
            if state.logged >= self.burst:
                state.left_out += 1
                return False
            state.logged += 1
            left_out, state.left_out = state.left_out, 0
        if left_out:
            message += f" (and {left_out} more such line(s) left out since the last one)"
        self.logger.log(level, message, *args)
        return True
