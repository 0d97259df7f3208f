"""A running node's state for its status page: what the node's threads record, and a snapshot the page reads.

The training thread (and the node before training) writes into a :class:`StatusBoard`; the page server's threads
only call :meth:`StatusBoard.snapshot`, which copies the state under a lock held for microseconds, at most once per
change and once a second. Nothing here touches the network or the disk, so a client polling the page never slows a
step.
"""

from __future__ import annotations

import bisect
import logging
import math
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SNAPSHOT_SECONDS = 1.0
"""How long one snapshot serves every reader while nothing is recorded: the page's routes read it, and render it,
at most once per change and once per this many seconds, however often they are asked."""

SERIES_POINTS = 2000
"""Points kept per plotted series; a longer run keeps every other point of the older ones (bounded memory)."""

STALL_STEPS = 10.0
"""A training node whose last step ended more than this many median step times ago (and at least
:data:`STALL_MIN_SECONDS`) is reported as stalled."""
STALL_MIN_SECONDS = 900.0
FIRST_STEP_SECONDS = 1800.0
"""Before its first step ends, a node staying this long in one phase (loading, joining, the first step or the
evaluation at step 0) is reported as stalled; a phase may ask for longer (:meth:`StatusBoard.set_phase`)."""

STEP_SECONDS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Upper bounds (seconds) of the step-duration histogram's buckets."""
PHASE_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the phase-duration histogram's buckets."""

_RECENT_PROBLEMS = 8
_PHASE_PREFIX = "sapo/time/"
_SET_ASIDE_PREFIX = "sapo/total/dropped/"


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


class Histogram:
    """Counts of observed values per bucket (Prometheus' cumulative `le` buckets), their sum and number."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count ``value`` (seconds) in the first bucket whose bound it does not exceed."""
        if math.isfinite(value) and value >= 0:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1
            self.sum += value

    def exposition(self) -> dict[str, Any]:
        """``{"buckets": [[bound, cumulative count], ..., ["+Inf", count]], "sum": ..., "count": ...}``."""
        cumulative, total = [], 0
        for bound, count in zip([*self.bounds, "+Inf"], self.counts, strict=True):
            total += count
            cumulative.append([bound, total])
        return {"buckets": cumulative, "sum": self.sum, "count": total}


class StatusBoard:
    """The state a node shows: who it is, phase and step, figures over steps, swarm, senders, health and problems.

    Written by the node (any thread), read by :meth:`snapshot` (any thread).

    Args:
        node_name: the title of the page.
        max_steps: the step the run ends at, if known.
        version: the software version shown (`sapo_build_info`).
        model: the policy's name shown (`sapo_build_info`).
        min_step_seconds: the node's pace (`--min_step_seconds`, default 0): a paced node is called stalled only
            after :data:`STALL_STEPS` paced steps without a step's end.
        clock: wall-clock seconds; tests pass a clock they move.
    """

    def __init__(
        self,
        node_name: str = "sapo-node",
        max_steps: int | None = None,
        *,
        version: str = "",
        model: str = "",
        min_step_seconds: float = 0.0,
        clock: Callable[[], float] = time.time,
    ):
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # one snapshot taken at a time: readers arriving meanwhile get that one
        self._min_step_seconds = min_step_seconds  # the node's pace: steps end at least this far apart
        self._clock = clock
        self._name = node_name
        self._version = version
        self._model = model
        self._started = clock()
        self._phase = "starting"
        self._phase_since = self._started
        self._phase_patience = 0.0
        self._step = 0
        self._steps_done = 0
        self._max_steps = max_steps
        self._set_aside: dict[str, float] = {}  # groups set aside so far, by reason (all senders, replay included)
        self._reward = Series()
        self._swarm_reward = Series()
        self._taken = Series()
        self._fill_ins = Series()
        self._held_out = Series()
        self._held_out_tasks: dict[str, Series] = {}
        self._step_seconds = Histogram(STEP_SECONDS_BUCKETS)
        self._phase_seconds: dict[str, Histogram] = {}
        self._step_ends: deque[float] = deque(maxlen=21)
        self._swarm: dict[str, Any] = {"state": "not started"}
        self._senders: dict[str, dict[str, int]] = {}
        self._problems: deque[dict[str, Any]] = deque(maxlen=_RECENT_PROBLEMS)
        self._last_error: dict[str, Any] | None = None
        self._page_url: str | None = None
        self._finished = False
        self._error_counts: Callable[[], dict[str, int]] = dict
        self._changes = 0  # writes so far: a snapshot is served again only while none came since it was taken
        self._last_snapshot: tuple[int, float, dict[str, Any]] | None = None  # (changes, time, snapshot)

    # ------------------------------------------------------------------------------ written by the node

    @contextmanager
    def _writing(self) -> Iterator[None]:
        with self._lock:
            self._changes += 1
            yield

    def set_phase(self, phase: str, step: int | None = None, patience: float = 0.0) -> None:
        """What the node does now (``loading model``, ``generating``...), at ``step`` (default: unchanged).

        ``patience``: seconds this phase may last before the first step without the node being called stalled, when
        more than :data:`FIRST_STEP_SECONDS` (e.g. waiting for peers with a long timeout)."""
        with self._writing():
            if phase != self._phase:
                self._phase_since = self._clock()
            self._phase_patience = patience
            self._phase = phase
            if step is not None:
                self._step = step
            self._finished = phase == "finished training"

    def step_done(self, step: int) -> None:
        """Steps completed so far (``step``: the trainer's ``global_step`` at a step's end, or resumed from)."""
        with self._writing():
            self._steps_done = max(self._steps_done, step)

    def set_max_steps(self, max_steps: int) -> None:
        """The step the run ends at."""
        with self._writing():
            self._max_steps = max_steps

    def count_errors(self, counts: Callable[[], dict[str, int]]) -> None:
        """Where the node's error counts are read at each snapshot (``{"reward": ..., "source": ...}``: own rows a
        reward function failed on, received items a task source raised on)."""
        self._error_counts = counts

    def set_page_url(self, url: str | None) -> None:
        """Where the page is served (shown on it, and in status.json)."""
        with self._writing():
            self._page_url = url

    def record_step(self, step: int, logs: dict[str, Any]) -> None:
        """A training line of the trainer's log, and the moment the step ended: its figures (:meth:`record_history`),
        the step's seconds (`step_time`, else the time since the previous step ended) and its phases' seconds
        (`sapo/time/<phase>`) for the duration histograms."""
        now = self._clock()
        with self._writing():
            seconds = logs.get("step_time")
            if not is_number(seconds) and self._step_ends and step > self._step:
                seconds = (now - self._step_ends[-1]) / (step - self._step)
            self._step = max(self._step, step)
            self._steps_done = max(self._steps_done, step)
            self._step_ends.append(now)
            self._add_figures(step, logs)
            if is_number(seconds):
                self._step_seconds.observe(float(seconds))
            for key, value in logs.items():
                if key.startswith(_PHASE_PREFIX) and is_number(value):
                    phase = key[len(_PHASE_PREFIX) :]
                    self._phase_seconds.setdefault(phase, Histogram(PHASE_SECONDS_BUCKETS)).observe(float(value))

    def record_history(self, step: int, logs: dict[str, Any]) -> None:
        """A training line logged before this process started (a resumed run's metrics.jsonl): only its figures, for
        the plots: the reward of this node's own completions (`sapo/local_reward`) and of the swarm groups it took,
        scored by its rewards (`sapo/external_reward`), swarm groups taken (`sapo/external_groups`) and filled in
        with its own (`sapo/fill_ins`)."""
        with self._writing():
            self._steps_done = max(self._steps_done, step)
            self._add_figures(step, logs)

    def _add_figures(self, step: int, logs: dict[str, Any]) -> None:
        figures = {
            self._reward: logs.get("sapo/local_reward", logs.get("reward")),
            self._swarm_reward: logs.get("sapo/external_reward"),
            self._taken: logs.get("sapo/external_groups"),
            self._fill_ins: logs.get("sapo/fill_ins"),
        }
        for series, value in figures.items():
            if is_number(value):
                series.add(step, float(value))
        # The trainer's running totals (`sapo/total/dropped/<reason>`): every reason, zero_advantage included, which
        # the per-sender outcomes do not attribute.
        for key, value in logs.items():
            if key.startswith(_SET_ASIDE_PREFIX) and is_number(value):
                self._set_aside[key[len(_SET_ASIDE_PREFIX) :]] = float(value)

    def record_held_out(
        self, step: int, pass_at_1: float, standard_error: float | None, per_task: dict[str, float] | None = None
    ) -> None:
        """A held-out evaluation at ``step``: greedy pass@1, its standard error, and pass@1 per task."""
        with self._writing():
            self._held_out.add(step, float(pass_at_1), standard_error)
            for task, value in (per_task or {}).items():
                if is_number(value):
                    self._held_out_tasks.setdefault(task, Series()).add(step, float(value))

    def record_swarm(self, swarm: Any, require_swarm: bool = False, rejoin_through: list[str] | None = None) -> str:
        """Read the swarm transport's peers, neighbours, counters and health (cheap, thread-safe calls that never
        wait on the network); returns the swarm state, "joined" or "alone"."""
        readout = swarm.readout()
        dialled = {address.rsplit("/p2p/", 1)[1] for address in readout.addresses if "/p2p/" in address}
        peers = [
            {"peer": p.peer, "model": p.model, "last_seen": p.last_seen}
            for p in sorted(swarm.peers(), key=lambda p: -p.last_seen)
        ]
        # A DHT transport counts its neighbours; another transport (in memory) is joined once it lists a peer.
        neighbours = int(readout.gauges.get("dht_neighbours", len(peers)))
        state = {
            "state": "joined" if neighbours > 0 else "alone",
            # The id others dial (the end of the join address); a transport without addresses has only its key's.
            "peer_id": next(iter(sorted(dialled)), readout.peer_id),
            "key_fingerprint": readout.peer_id,
            "addresses": list(readout.addresses),
            "healthy": readout.healthy,
            "neighbours": neighbours,
            "peers": peers,
            "counters": dict(readout.counters),
            "rejoin_through": list(rejoin_through or []),
            "require_swarm": require_swarm,
        }
        with self._writing():
            self._swarm = state
        return state["state"]

    def record_senders(self, outcomes: dict[str, Counter[str]]) -> None:
        """Groups taken and dropped (by reason) per sender: the trainer's ``sender_outcomes``."""
        copied = {sender: dict(counts) for sender, counts in outcomes.items()}
        with self._writing():
            self._senders = copied

    def record_problem(self, level: str, message: str, source: str) -> None:
        """A warning or error the node logged; the newest error is the page's "last error"."""
        problem = {"time": self._clock(), "level": level, "message": message, "source": source}
        with self._writing():
            self._problems.append(problem)
            if level in ("ERROR", "CRITICAL"):
                self._last_error = problem

    # ------------------------------------------------------------------------------ read by the page

    def snapshot(self) -> dict[str, Any]:
        """The node's state now, as plain JSON-ready data (a copy: later updates never change it).

        Until something is recorded, and for at most :data:`SNAPSHOT_SECONDS`, every call returns the same object
        (treat it as read-only), so that however often the page is asked it copies the state, and renders it, at most
        once per change and once a second."""
        with self._reading:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            if self._last_snapshot is not None:
                changes, taken_at, snap = self._last_snapshot
                if changes == self._changes and 0 <= now - taken_at < SNAPSHOT_SECONDS:
                    return snap
            changes = self._changes
            ends = list(self._step_ends)
            snap = {
                "node": self._name,
                "version": self._version,
                "model": self._model,
                "time": now,
                "started": self._started,
                "phase": self._phase,
                "phase_since": self._phase_since,
                "phase_patience": self._phase_patience,
                "min_step_seconds": self._min_step_seconds,
                "step": self._step,
                "steps_done": self._steps_done,
                "max_steps": self._max_steps,
                "finished": self._finished,
                "page_url": self._page_url,
                "reward": _points(self._reward),
                "swarm_reward": _points(self._swarm_reward),
                "taken": _points(self._taken),
                "fill_ins": _points(self._fill_ins),
                "held_out": [[s, v, e] for s, v, e in self._held_out.points],
                "held_out_tasks": {task: _points(series) for task, series in sorted(self._held_out_tasks.items())},
                "step_seconds_histogram": self._step_seconds.exposition(),
                "phase_seconds_histogram": {
                    phase: histogram.exposition() for phase, histogram in sorted(self._phase_seconds.items())
                },
                "swarm": {**self._swarm, "peers": list(self._swarm.get("peers", []))},
                "senders": {sender: dict(counts) for sender, counts in self._senders.items()},
                "set_aside": dict(sorted(self._set_aside.items())),
                "problems": list(self._problems),
                "last_error": self._last_error,
            }
        snap["errors"] = dict(self._error_counts())
        durations = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        snap["step_seconds"] = statistics.median(durations) if durations else None
        snap["last_step_time"] = ends[-1] if ends else None
        snap["health"] = _health(snap)
        with self._lock:
            self._last_snapshot = (changes, now, snap)
        return snap


def _points(series: Series) -> list[list[float]]:
    return [[step, value] for step, value, _ in series.points]


def is_number(value: Any) -> bool:
    """True for a finite int or float (not a bool): a figure worth plotting."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _health(snap: dict[str, Any]) -> dict[str, Any]:
    """``{"status": "ok" | "degraded" | "unhealthy", "problems": [...]}`` from a snapshot: unhealthy when the swarm
    transport is down, or when no step ended within the expected time (:data:`STALL_STEPS` median steps, or paced
    steps where the node is paced, and at least :data:`STALL_MIN_SECONDS`; before the first step,
    :data:`FIRST_STEP_SECONDS` in one phase)."""
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
        limit = max(STALL_MIN_SECONDS, STALL_STEPS * max(snap["step_seconds"] or 0.0, snap["min_step_seconds"]))
        if snap["time"] - last > limit:
            status = "unhealthy"
            problems.append(f"stalled: no step ended for {snap['time'] - last:.0f} s (limit {limit:.0f} s)")
    elif last is None and not snap["finished"]:
        limit = max(FIRST_STEP_SECONDS, snap["phase_patience"])
        if snap["time"] - snap["phase_since"] > limit:
            status = "unhealthy"
            problems.append(
                f"stalled: {snap['phase']!r} for {snap['time'] - snap['phase_since']:.0f} s before the first step "
                f"(limit {limit:.0f} s)"
            )
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
