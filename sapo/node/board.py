"""A running node's state for its status page: what the node's threads record, and a snapshot the page reads.

The training thread (and the node before training) writes into a :class:`StatusBoard`; the page server's threads
only call :meth:`StatusBoard.snapshot`, which copies the state under a lock held for microseconds. Nothing here
touches the network or the disk, so a client polling the page never slows a step.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import Counter, deque
from typing import Any

SERIES_POINTS = 2000
"""Points kept per plotted series; a longer run keeps every other point of the older ones (bounded memory)."""

STALL_STEPS = 10.0
"""A training node whose last step ended more than this many median step times ago (and at least
:data:`STALL_MIN_SECONDS`) is reported as stalled."""
STALL_MIN_SECONDS = 900.0

_RECENT_PROBLEMS = 8


class Series:
    """(step, value) points of one figure over a run, bounded to ``limit`` points by halving the resolution."""

    def __init__(self, limit: int = SERIES_POINTS):
        self.limit = limit
        self.points: list[tuple[int, float, float | None]] = []

    def add(self, step: int, value: float, error: float | None = None) -> None:
        """Add (or, for a step seen before, replace) the value at ``step``; ``error`` is its standard error."""
        if math.isnan(value):
            return
        while self.points and self.points[-1][0] >= step:  # a restarted node logs the steps after its checkpoint again
            self.points.pop()
        self.points.append((step, value, error))
        if len(self.points) > self.limit:
            self.points = self.points[:-1:2] + self.points[-1:]


class StatusBoard:
    """The state a node shows: phase and step, figures over steps, swarm, senders, health and problems.

    Written by the node (any thread), read by :meth:`snapshot` (any thread).
    """

    def __init__(self, node_name: str = "sapo-node", max_steps: int | None = None):
        self._lock = threading.Lock()
        self._name = node_name
        self._started = time.time()
        self._phase = "starting"
        self._step = 0
        self._max_steps = max_steps
        self._reward = Series()
        self._held_out = Series()
        self._step_ends: deque[float] = deque(maxlen=21)
        self._swarm: dict[str, Any] = {"state": "not started"}
        self._senders: dict[str, dict[str, int]] = {}
        self._problems: deque[dict[str, Any]] = deque(maxlen=_RECENT_PROBLEMS)
        self._last_error: dict[str, Any] | None = None
        self._page_url: str | None = None
        self._finished = False

    # ------------------------------------------------------------------------------ written by the node

    def set_phase(self, phase: str, step: int | None = None) -> None:
        """What the node does now (``loading model``, ``generating``...), at ``step`` (default: unchanged)."""
        with self._lock:
            self._phase = phase
            if step is not None:
                self._step = step
            self._finished = phase == "finished training"

    def set_max_steps(self, max_steps: int) -> None:
        """The step the run ends at."""
        with self._lock:
            self._max_steps = max_steps

    def set_page_url(self, url: str | None) -> None:
        """Where the page is served (shown on it, and in status.json)."""
        with self._lock:
            self._page_url = url

    def record_step(self, step: int, logs: dict[str, Any]) -> None:
        """A training line of the trainer's log: its reward, and the moment the step ended."""
        reward = logs.get("sapo/local_reward", logs.get("reward"))
        with self._lock:
            self._step = max(self._step, step)
            self._step_ends.append(time.time())
            if isinstance(reward, int | float):
                self._reward.add(step, float(reward))

    def record_held_out(self, step: int, pass_at_1: float, standard_error: float | None) -> None:
        """A held-out evaluation: greedy pass@1 and its standard error at ``step``."""
        with self._lock:
            self._held_out.add(step, float(pass_at_1), standard_error)

    def record_swarm(self, swarm: Any, require_swarm: bool = False, rejoin_through: list[str] | None = None) -> str:
        """Read the swarm transport's peers, neighbours, counters and health (cheap, thread-safe calls that never
        wait on the network); returns the swarm state, "joined" or "alone"."""
        readout = swarm.readout()
        peers = [
            {"peer": p.peer, "model": p.model, "last_seen": p.last_seen}
            for p in sorted(swarm.peers(), key=lambda p: -p.last_seen)
        ]
        # A DHT transport counts its neighbours; another transport (in memory) is joined once it lists a peer.
        neighbours = int(readout.gauges.get("dht_neighbours", len(peers)))
        state = {
            "state": "joined" if neighbours > 0 else "alone",
            "peer_id": readout.peer_id,
            "addresses": list(readout.addresses),
            "healthy": readout.healthy,
            "neighbours": neighbours,
            "peers": peers,
            "counters": dict(readout.counters),
            "rejoin_through": list(rejoin_through or []),
            "require_swarm": require_swarm,
        }
        with self._lock:
            self._swarm = state
        return state["state"]

    def record_senders(self, outcomes: dict[str, Counter[str]]) -> None:
        """Groups taken and dropped (by reason) per sender: the trainer's ``sender_outcomes``."""
        copied = {sender: dict(counts) for sender, counts in outcomes.items()}
        with self._lock:
            self._senders = copied

    def record_problem(self, level: str, message: str, source: str) -> None:
        """A warning or error the node logged; the newest error is the page's "last error"."""
        problem = {"time": time.time(), "level": level, "message": message, "source": source}
        with self._lock:
            self._problems.append(problem)
            if level in ("ERROR", "CRITICAL"):
                self._last_error = problem

    # ------------------------------------------------------------------------------ read by the page

    def snapshot(self) -> dict[str, Any]:
        """The node's state now, as plain JSON-ready data (a copy: later updates never change it)."""
        with self._lock:
            ends = list(self._step_ends)
            snap = {
                "node": self._name,
                "time": time.time(),
                "started": self._started,
                "phase": self._phase,
                "step": self._step,
                "max_steps": self._max_steps,
                "finished": self._finished,
                "page_url": self._page_url,
                "reward": [[s, v] for s, v, _ in self._reward.points],
                "held_out": [[s, v, e] for s, v, e in self._held_out.points],
                "swarm": {**self._swarm, "peers": list(self._swarm.get("peers", []))},
                "senders": {sender: dict(counts) for sender, counts in self._senders.items()},
                "problems": list(self._problems),
                "last_error": self._last_error,
            }
        durations = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        snap["step_seconds"] = statistics.median(durations) if durations else None
        snap["last_step_time"] = ends[-1] if ends else None
        snap["health"] = _health(snap)
        return snap


def _health(snap: dict[str, Any]) -> dict[str, Any]:
    """``{"status": "ok" | "degraded" | "unhealthy", "problems": [...]}`` from a snapshot."""
    problems: list[str] = []
    status = "ok"
    swarm = snap["swarm"]
    if swarm.get("state") == "alone" and swarm.get("rejoin_through"):
        status = "degraded"
        through = ", ".join(swarm["rejoin_through"])
        problems.append(
            f"alone: no other peer reachable, every slot is filled with this node's own groups; trying to join "
            f"through {through} in the background"
        )
    elif swarm.get("state") == "alone":
        problems.append("no other peer has joined this new swarm yet: every slot is filled with this node's groups")
    if swarm.get("healthy") is False and not snap["finished"]:
        status = "unhealthy"
        problems.append("the swarm transport is down (its p2pd died): restart the node")
    last = snap["last_step_time"]
    if last is not None and not snap["finished"]:
        limit = max(STALL_MIN_SECONDS, STALL_STEPS * (snap["step_seconds"] or 0.0))
        if snap["time"] - last > limit:
            status = "unhealthy"
            problems.append(f"stalled: no step ended for {snap['time'] - last:.0f} s (limit {limit:.0f} s)")
    return {"status": status, "problems": problems}


class BoardLogHandler(logging.Handler):
    """Sends the node's warnings and errors (loggers ``sapo`` and ``swarm``) to a :class:`StatusBoard`."""

    def __init__(self, board: StatusBoard):
        super().__init__(level=logging.WARNING)
        self.board = board

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.board.record_problem(record.levelname, record.getMessage(), record.name)
        except Exception:  # a log line must never break the node
            self.handleError(record)
