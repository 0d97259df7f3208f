"""The status page server: `/` (HTML), `/status.json`, `/metrics` (Prometheus text) and `/healthz`.

A WSGI application served by the standard library's `wsgiref` server, one daemon thread per request (no HTTP is
parsed here), with `prometheus_client` writing the exposition format. Every route reads a snapshot
(:meth:`sapo.node.board.StatusBoard.snapshot`), so a client polling the page never waits on, or slows, training.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from sapo.node.page import latest, node_page
from swarm.labels import top_senders

logger = logging.getLogger("sapo.node")

DEFAULT_STATUS_PORT = 31338
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


MAX_CONNECTIONS = 32
"""Connections the page serves at once; one more is closed as soon as it is accepted. Each holds a thread and a file
descriptor, so idle ones without a bound (about 1,000 under systemd's default of 1,024 open files) made the node's
next file open fail and stopped it."""

CONNECTIONS_PER_SECOND = 20.0
"""Connections the page accepts per second on average, in bursts of up to :data:`MAX_CONNECTIONS`. Beyond it the
server waits before accepting the next one, the others left waiting in the kernel's queue (those past it retried by
their client), so a client asking as fast as it is answered costs the node this many requests a second, not most of a
core in threads and HTTP parsing. A browser, `local-swarm` and a Prometheus scraper ask a few times a minute."""

REQUEST_TIMEOUT_SECONDS = 10.0
"""How long a connection may wait for the client's next bytes before it is closed."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a stuck client never keeps the node from exiting

    def __init__(self, *args: Any, **kwargs: Any):
        self.max_connections = MAX_CONNECTIONS
        self.open_connections = 0  # being served now
        self.connections_refused = 0  # closed at once: max_connections were served
        self.connections_per_second = CONNECTIONS_PER_SECOND
        self.connections_delayed = 0  # accepted late: they came faster than connections_per_second
        self._allowance = float(MAX_CONNECTIONS)  # connections that may be accepted now (a token bucket)
        self._allowance_at = time.monotonic()
        self._count_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve ``request`` on a thread of its own, or close it at once when ``max_connections`` are served; first
        wait (the next connections wait in the kernel's queue meanwhile) while they come faster than
        ``connections_per_second``."""
        wait = self._reserve_allowance()
        if wait > 0:
            self.connections_delayed += 1
            time.sleep(wait)
        with self._count_lock:
            full = self.open_connections >= self.max_connections
            if full:
                self.connections_refused += 1
            else:
                self.open_connections += 1
        if full:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._closed_one()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """ThreadingMixIn's, then the connection no longer counts."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed_one()

    def _reserve_allowance(self) -> float:
        """Take one connection's allowance (a token bucket, refilled at ``connections_per_second`` up to
        ``max_connections``); the seconds to wait until it is there."""
        now = time.monotonic()
        refill = (now - self._allowance_at) * self.connections_per_second
        self._allowance = min(float(self.max_connections), self._allowance + refill) - 1.0
        self._allowance_at = now
        return max(0.0, -self._allowance / self.connections_per_second)

    def _closed_one(self) -> None:
        with self._count_lock:
            self.open_connections -= 1


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_SECONDS  # the socket's: a client silent this long is closed (socketserver reads it)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the name http.server uses)
        logger.debug("status page: %s", format % args)


def _respond(
    start_response: Callable[..., Any],
    status: str,
    body: bytes,
    content_type: str,
    headers: Sequence[tuple[str, str]] = (),
) -> list[bytes]:
    start_response(
        status,
        [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", "no-store"), *headers],
    )
    return [body]


class SnapshotCollector:
    """A `prometheus_client` collector that turns a node's snapshot into metrics at each scrape."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.snapshot = snapshot

    def describe(self) -> list[Any]:
        return []  # metrics are only known at scrape time (senders, reasons); skip registration-time checks

    def collect(self) -> Iterable[Any]:
        """The node's figures: who it is, step, rewards, groups per step, held-out pass@1, durations, swarm and
        per-sender groups, health."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.snapshot()
        swarm = snap["swarm"]

        def gauge(name: str, text: str, value: float | None) -> Iterable[Any]:
            if value is not None:
                yield GaugeMetricFamily(name, text, value=float(value))

        build = GaugeMetricFamily(
            "sapo_build_info", "1, labelled with the node's software version and policy.", labels=["version", "model"]
        )
        build.add_metric([snap.get("version") or "unknown", snap.get("model") or "unknown"], 1.0)
        yield build
        yield from gauge("sapo_step", "Training steps completed.", snap.get("steps_done", snap["step"]))
        yield from gauge("sapo_max_steps", "Step the run ends at.", snap.get("max_steps"))
        yield from gauge("sapo_training_reward", "Mean reward of this node's own completions, last step.",
                         latest(snap["reward"]))  # fmt: skip
        yield from gauge("sapo_swarm_groups_reward", "Mean reward, under this node's reward functions, of the swarm "
                         "groups it trained on, last step that took one.", latest(snap["swarm_reward"]))  # fmt: skip
        yield from gauge("sapo_step_swarm_groups", "Swarm groups trained on in the last step.",
                         latest(snap["taken"]))  # fmt: skip
        yield from gauge("sapo_step_fill_ins", "Swarm slots filled with this node's own groups in the last step.",
                         latest(snap["fill_ins"]))  # fmt: skip
        yield from gauge("sapo_held_out_pass_at_1", "Greedy pass@1 on held-out questions, last evaluation.",
                         latest(snap["held_out"]))  # fmt: skip
        by_task = GaugeMetricFamily(
            "sapo_held_out_task_pass_at_1", "Greedy pass@1 on held-out questions of one task, last evaluation.",
            labels=["task"],
        )  # fmt: skip
        for task, points in snap["held_out_tasks"].items():
            by_task.add_metric([task], float(latest(points)))
        yield by_task
        yield _histogram(
            "sapo_step_duration_seconds", "Seconds per training step (one observation per logged step).",
            {(): snap["step_seconds_histogram"]},
        )  # fmt: skip
        phases = {(phase,): histogram for phase, histogram in snap["phase_seconds_histogram"].items()}
        yield _histogram(
            "sapo_phase_duration_seconds", "Seconds spent in each phase of a step (`sapo/time/<phase>`, one "
            "observation per logged step).", phases, ["phase"],
        )  # fmt: skip
        yield from gauge("sapo_step_seconds", "Median seconds per step over the last 20 steps.", snap["step_seconds"])
        yield from gauge("sapo_last_step_timestamp_seconds", "Unix time the last step ended (alert on staleness).",
                         snap["last_step_time"])  # fmt: skip
        yield from gauge("sapo_peers", "Other peers listed in the swarm.", len(swarm.get("peers", [])))
        yield from gauge("sapo_dht_neighbours", "DHT neighbours; 0: alone.", swarm.get("neighbours"))
        yield from gauge("sapo_swarm_alone", "1 while no other peer is reachable (slots filled locally).",
                         1.0 if swarm.get("state") == "alone" else 0.0)  # fmt: skip
        errors = CounterMetricFamily(
            "sapo_errors", "Errors the node counted and went on: `reward`, own rows a reward function failed on "
            "(scored as failed); `source`, received items a task source raised on (dropped).", labels=["kind"]
        )  # fmt: skip
        for kind, count in sorted((snap.get("errors") or {}).items()):
            errors.add_metric([kind], float(count))
        yield errors
        phase = GaugeMetricFamily("sapo_phase", "What the node does now (1 for the current phase).", labels=["phase"])
        phase.add_metric([snap["phase"]], 1.0)
        yield phase
        health = GaugeMetricFamily("sapo_health", "1 for the node's health status now.", labels=["status"])
        for status in ("ok", "degraded", "unhealthy"):
            health.add_metric([status], 1.0 if snap["health"]["status"] == status else 0.0)
        yield health
        taken = CounterMetricFamily(
            "sapo_groups_taken", "Groups of other peers trained on, by sender (its key fingerprint).", labels=["sender"]
        )
        dropped = CounterMetricFamily(
            "sapo_groups_dropped", "Groups of other peers dropped, by sender (its key fingerprint) and reason.",
            labels=["sender", "reason"],
        )  # fmt: skip
        # a bounded set of label values: the top senders by name, every other one summed under "other"
        for sender, counts in sorted(top_senders(snap["senders"]).items()):
            taken.add_metric([sender], float(counts.get("taken", 0)))
            for key, count in sorted(counts.items()):
                if key.startswith("dropped/"):
                    dropped.add_metric([sender, key.split("/", 1)[1]], float(count))
        yield taken
        yield dropped
        by_reason = CounterMetricFamily(
            "sapo_groups_dropped_by_reason", "Groups set aside by the intake, by reason, whoever sent them (swarm and "
            "self-replay): every reason, `zero_advantage` included, which `sapo_groups_dropped` does not attribute "
            "to a sender.", labels=["reason"],
        )  # fmt: skip
        for reason, count in sorted((snap.get("set_aside") or {}).items()):
            by_reason.add_metric([reason], float(count))
        yield by_reason
        events = CounterMetricFamily(
            "sapo_swarm_events", "What the swarm transport did (groups published, fetched, rejected/<reason>, "
            "rejoins...).", labels=["event"]
        )  # fmt: skip
        for name, count in sorted((swarm.get("counters") or {}).items()):
            events.add_metric([name], float(count))
        yield events


def _histogram(name: str, text: str, series: dict[tuple[str, ...], dict[str, Any]], labels: Sequence[str] = ()) -> Any:
    """A histogram family from :meth:`sapo.node.board.Histogram.exposition` values, one per label tuple."""
    from prometheus_client.core import HistogramMetricFamily

    family = HistogramMetricFamily(name, text, labels=list(labels))
    for label_values, histogram in series.items():
        buckets = [(bound if bound == "+Inf" else repr(float(bound)), count) for bound, count in histogram["buckets"]]
        family.add_metric(list(label_values), buckets, histogram["sum"])
    return family


def healthz_body(health: dict[str, Any]) -> str:
    """`/healthz`'s text: the status on the first line, then one line per problem."""
    return "".join(f"{line}\n" for line in [health["status"], *health["problems"]])


INSTANCE_HEADER = "X-Sapo-Instance"
"""The `/healthz` header naming the node process that answers (the ``instance`` its status.json records): a port a
node left may be taken by another node's page, which must not answer for it (`sapo-node health`)."""


def node_app(snapshot: Callable[[], dict[str, Any]], instance: str = "") -> WsgiApp:
    """The WSGI application of one node's status page; ``instance`` names the node process in `/healthz`'s
    :data:`INSTANCE_HEADER`."""
    from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, make_wsgi_app

    registry = CollectorRegistry()
    registry.register(SnapshotCollector(snapshot))
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
    PlatformCollector(registry=registry)
    metrics = make_wsgi_app(registry)
    rendered: dict[str, tuple[dict[str, Any], bytes]] = {}  # per route: the snapshot rendered and its body
    rendering = threading.Lock()

    def body(route: str, render: Callable[[dict[str, Any]], str]) -> bytes:
        # A route's body is rendered once per snapshot (a new one at most once per change and once a second), so
        # a client asking hundreds of times a second costs the node no rendering of its own.
        with rendering:
            snap = snapshot()
            kept = rendered.get(route)
            if kept is None or kept[0] is not snap:
                kept = rendered[route] = (snap, render(snap).encode())
            return kept[1]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/status.json":
            return _respond(start_response, "200 OK", body(path, json.dumps), "application/json")
        if path == "/healthz":
            health = snapshot()["health"]
            code = "503 Service Unavailable" if health["status"] == "unhealthy" else "200 OK"
            text = healthz_body(health).encode()
            return _respond(start_response, code, text, "text/plain; charset=utf-8", [(INSTANCE_HEADER, instance)])
        if path in ("/", "/index.html"):
            return _respond(start_response, "200 OK", body("/", node_page), "text/html; charset=utf-8")
        return _respond(start_response, "404 Not Found", b"not found: try / /status.json /metrics\n", "text/plain")

    return app


class StatusServer:
    """Serves a WSGI app on ``host:port`` from daemon threads until :meth:`close`.

    Args:
        app: the WSGI application (:func:`node_app`, or local-swarm's page).
        host: interface to listen on; ``127.0.0.1`` (the default) keeps the page on this machine.
        port: TCP port; 0 picks a free one.
        fallback: when ``port`` is taken, listen on a free port instead (with a warning) rather than fail.

    Raises:
        OSError: the address cannot be bound (and ``fallback`` is off, or a free port fails too).
    """

    def __init__(self, app: WsgiApp, host: str = "127.0.0.1", port: int = DEFAULT_STATUS_PORT, fallback: bool = True):
        server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
        try:
            self._server = make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)
        except OSError as e:
            if not fallback or e.errno != errno.EADDRINUSE or port == 0:
                raise
            self._server = make_server(host, 0, app, server_class=server_class, handler_class=_QuietHandler)
            logger.warning(
                "status page: port %d is in use (another node?); serving on port %d instead (set --status_port)",
                port, self._server.server_port,
            )  # fmt: skip
        self.host = host
        self.port = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.5}, name="status-page", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """The page's address (for a wildcard host: as seen from this machine)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(
            self.host, f"[{self.host}]" if ":" in self.host else self.host
        )
        return f"http://{host}:{self.port}/"

    def close(self) -> None:
        """Stop serving and release the port; idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
