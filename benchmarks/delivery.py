"""Delivery latency of a swarm transport: from a group's publication at one peer to its return by ``fetch`` at another.

An observer is an ordinary peer that publishes nothing and calls ``fetch`` every ``poll_interval`` seconds; the
first time a group comes back, its delivery latency is the observer's clock minus the group's ``created_at`` (set
by the publisher just before ``publish``). Both clocks are one machine's (or namespaces of one machine), so the
figure needs no clock synchronisation; it is an upper bound by at most ``poll_interval``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import percentile


@dataclass
class DeliveryLog:
    """First-sighting latencies (seconds) by group id, and the ids of every group published (to count the lost)."""

    latencies: dict[str, float] = field(default_factory=dict)
    published: set[str] = field(default_factory=set)

    def summary(self) -> dict[str, Any]:
        """Median, p95 and max latency, and the share of published groups an observer ever saw."""
        values = list(self.latencies.values())
        seen = len(set(self.latencies) & self.published) if self.published else len(values)
        return {
            "delivered": len(values),
            "published": len(self.published),
            "delivered_share": seen / len(self.published) if self.published else None,
            "latency_median_s": percentile(values, 0.5),
            "latency_p95_s": percentile(values, 0.95),
            "latency_max_s": max(values) if values else None,
        }


class DeliveryObserver:
    """Polls ``transport.fetch(max_groups)`` in a thread and records each group's first-sighting latency."""

    def __init__(self, transport: Any, log: DeliveryLog, poll_interval: float = 0.25, max_groups: int = 1000):
        self.transport, self.log = transport, log
        self.poll_interval, self.max_groups = poll_interval, max_groups
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delivery-observer", daemon=True)

    def start(self) -> DeliveryObserver:
        """Start polling."""
        self._thread.start()
        return self

    def poll(self) -> int:
        """One fetch; returns how many groups were seen for the first time."""
        now, new = time.time(), 0
        for received in self.transport.fetch(self.max_groups):
            group = received.group
            if group.group_id not in self.log.latencies:
                self.log.latencies[group.group_id] = now - group.created_at
                new += 1
        return new

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval):
            self.poll()

    def stop(self) -> None:
        """Stop polling (returns once the thread has ended)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def pooled_summary(logs: list[DeliveryLog]) -> dict[str, Any]:
    """:meth:`DeliveryLog.summary` over several observers: latencies pooled (each observer's first sightings), the
    delivered share the mean of the observers' shares, ``published`` the largest of their published sets."""
    values = [v for log in logs for v in log.latencies.values()]
    shares = [s for s in (log.summary()["delivered_share"] for log in logs) if s is not None]
    return {
        "observers": len(logs),
        "delivered": len(values),
        "published": max((len(log.published) for log in logs), default=0),
        "delivered_share": sum(shares) / len(shares) if shares else None,
        "latency_median_s": percentile(values, 0.5),
        "latency_p95_s": percentile(values, 0.95),
        "latency_max_s": max(values) if values else None,
    }
