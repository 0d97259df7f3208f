"""Which libp2p hosts a reader may ask for records now: a host rests after a failed request, and is asked at most
:data:`HOST_REQUESTS` times per ``SERVE_WINDOW_SECONDS``.

A host whose request failed (unreachable, timed out: the network, or a peer that left) rests: from
``fetch_retry_after`` seconds, doubling with each failure in a row, when its sender was judged good, and
:data:`LONGEST_REST_SECONDS` otherwise, or until it is heard from after the failure. :class:`HostRests` keeps no lock
of its own: :class:`swarm.senders.SenderBook` calls it under its lock.
"""

from __future__ import annotations

import collections

from swarm.serve_gate import SERVE_BUDGET_REQUESTS, SERVE_WINDOW_SECONDS

__all__ = ["HOST_REQUESTS", "LONGEST_REST_SECONDS", "HostRests"]

HOST_REQUESTS = SERVE_BUDGET_REQUESTS // 2
"""Record requests this reader makes of one libp2p host per ``SERVE_WINDOW_SECONDS``: half what a publisher answers one
peer, so that this reader never makes an honest host rest it. Index entries name their host unchecked, so identities
naming an honest publisher's host, each listing records, made the reader ask that host past its budget: it rested the
reader and answered it empty, its own records too, and the reader struck the honest sender for them."""

LONGEST_REST_SECONDS = 30.0
"""The longest rest of a host (and of a sender, :class:`swarm.senders.SenderBook`); a host whose sender is not judged
good rests this long at once."""


class HostRests:
    """The hosts a reader asked lately, those whose requests failed and how often in a row, and when each may be asked
    again (not thread-safe: its owner holds a lock)."""

    def __init__(self) -> None:
        self._requests: dict[str, collections.deque[float]] = {}  # monotonic times of requests begun, per host
        self._until: dict[str, tuple[float, float]] = {}  # host -> (monotonic time it may be asked again, wall time)
        self._failures: collections.Counter[str] = collections.Counter()  # failed requests in a row, by host

    def asked(self, host: str, monotonic: float) -> None:
        """A request to ``host`` began at ``monotonic``."""
        self._requests.setdefault(host, collections.deque()).append(monotonic)

    def at_budget(self, monotonic: float) -> set[str]:
        """Hosts asked :data:`HOST_REQUESTS` times within the last ``SERVE_WINDOW_SECONDS`` (forgetting older asks)."""
        at_budget = set()
        for host in list(self._requests):
            times = self._requests[host]
            while times and times[0] <= monotonic - SERVE_WINDOW_SECONDS:
                times.popleft()
            if not times:
                del self._requests[host]
            elif len(times) >= HOST_REQUESTS:
                at_budget.add(host)
        return at_budget

    def failed(self, host: str, retry_after: float | None, monotonic: float, wall: float) -> None:
        """A request to ``host`` failed: it rests :data:`LONGEST_REST_SECONDS`, or ``retry_after`` seconds doubling with
        each failure in a row when given (its sender was judged good: an honest host is retried soon, a failure under
        load), whichever is less."""
        self._failures[host] += 1
        seconds = LONGEST_REST_SECONDS
        if retry_after is not None:
            seconds = min(seconds, retry_after * 2 ** (self._failures[host] - 1))
        self._until[host] = (monotonic + seconds, wall)

    def answered(self, host: str) -> None:
        """``host`` answered: its failures in a row start again from none."""
        self._failures.pop(host, None)

    def heard_from(self, host: str, at: float) -> None:
        """Word from ``host`` dated ``at`` (wall time): a rest begun by a failure before it ends."""
        rest = self._until.get(host)
        if rest is not None and at > rest[1]:
            del self._until[host]

    def resting(self, monotonic: float) -> set[str]:
        """Hosts whose last request failed within their rest and that were not heard from since."""
        for host in [host for host, (until, _) in self._until.items() if until <= monotonic]:
            del self._until[host]
        return set(self._until)

    def forget_all_but(self, hosts: set[str | None]) -> None:
        """Forget the failures in a row of hosts not in ``hosts`` (no known sender is served from them any more)."""
        for host in [host for host in self._failures if host not in hosts]:
            del self._failures[host]
