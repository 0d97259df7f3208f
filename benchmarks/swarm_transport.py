"""Benchmark of the hivemind DHT transport: latency, delivery, CPU, bytes and memory per peer for N peers.

DHT-only peers (no model) on 127.0.0.1. Peers run as ``DHTTransport`` objects spread over worker processes
(``min(N, 4)`` workers, each hosting ``N / workers`` peers, each peer with its own p2pd), the way one machine
allows: one Python process per peer would cost ~300 MB each (hivemind imports torch). Every peer publishes a
realistic record (4 groups x 8 completions x ~1500 characters) once per step and fetches J groups of others per step.

The load per peer is held constant and the machine unsaturated: by default a step lasts
``max(--interval, N * --per-peer-seconds)`` seconds, so the swarm's steps per second (its demand on the CPU) stay the
same at every N and the per-step costs of a peer are comparable across N (``--fixed-interval``: every N steps every
``--interval`` seconds, the former mode, which saturates the machine at large N). A separate process hosts
``--observers`` observer peers (:mod:`benchmarks.delivery`: client-mode peers that publish nothing and poll ``fetch``)
that measure each group's delivery latency, from its creation at the publisher to its first return by ``fetch``.

Usage:
    python -m benchmarks.swarm_transport            # N = 2, 8, 32, 64 (64 only if memory allows)
    python -m benchmarks.swarm_transport --quick    # N = 2, 8, short runs

Writes benchmarks/results/swarm_transport.{json,md,png}. Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS,
    ROOT,
    cpu_seconds,
    meminfo_bytes,
    rss_mb,
    run_record,
    stop_processes,
    summary,
)
from benchmarks.swarm_transport_report import NOTES, write_outputs
from benchmarks.transport_accounting import count_rpc_bytes, io_bytes, tcp_sockets, tcp_traffic

# Seconds of step interval per peer (the default of --per-peer-seconds), from small measurements on this 2-core
# machine (shared with other benchmarks): a peer step cost 0.14 CPU s (Python + p2pd) at N = 8 every 3 s, 0.23 every
# 12 s (so ~0.01 CPU s per peer per second of background work, ~0.11 per step), and 0.52 at N = 32 every 12 s, where
# 0.375 s per peer made the swarm use 1.4 cores: a step's cost grows with N. 0.75 s per peer keeps the swarm near
# or under one core up to N = 64 (N = 8: 6 s, 32: 24 s, 64: 48 s), leaving the other core to the rest.
PER_PEER_SECONDS = 0.75


def interval_for(n: int, args: argparse.Namespace) -> float:
    """Seconds between two steps of a peer at swarm size ``n``: ``--interval``, or with load scaling (the default)
    ``max(--interval, n * --per-peer-seconds)`` so that the whole swarm makes the same steps per second at any n."""
    if args.fixed_interval:
        return args.interval
    return max(args.interval, n * args.per_peer_seconds)


def duration_for(interval: float, args: argparse.Namespace) -> float:
    """Measured seconds of a run: ``--duration``, or longer if needed for ``--min-steps`` steps per peer after which
    the observers still have ``--delivery-window`` seconds to see the groups."""
    return max(args.duration, args.delivery_window + args.min_steps * interval)


def transport_overrides(settings: list[str]) -> dict[str, Any]:
    """``FIELD=VALUE`` strings as DHTTransportConfig keyword arguments, each value parsed as the field's type."""
    import dataclasses

    from swarm.dht import DHTTransportConfig

    fields = {f.name: f for f in dataclasses.fields(DHTTransportConfig)}
    overrides: dict[str, Any] = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        if name not in fields or not value:
            raise SystemExit(f"--set {setting!r}: expected FIELD=VALUE with a DHTTransportConfig field")
        kind = type(getattr(DHTTransportConfig(), name))
        overrides[name] = value.lower() in ("1", "true") if kind is bool else kind(value)
    return overrides


# ------------------------------------------------------------------------------------------------
# worker processes: host some peers (or the observers), run the steps, report raw measurements as JSON


def make_groups(peer: str, step: int, rng: random.Random) -> list:
    """4 groups of 8 completions of ~1500 characters: a realistic record to publish (ids unique in the swarm)."""
    from swarm.records import Group, Provenance

    words = "the of and to in is that for it as with was on be by this are or at from".split()
    return [
        Group(
            group_id=f"{peer}-{step}-{g}",
            prompt=[{"role": "user", "content": f"Question {g} of step {step} from {peer}: what is {g} + {step}?"}],
            completions=[" ".join(rng.choices(words, k=400))[:1500] for _ in range(8)],
            provenance=Provenance(source="reasoning_gym", dataset="basic_arithmetic", seed=step, index=g),
            metadata={"answer": str(g + step)},
            model="bench",
            step=step,
            created_at=time.time(),
        )
        for g in range(4)
    ]


def _wait_for_go() -> float:
    """Block until the coordinator's ``GO <start time>`` line; returns the start time."""
    start = float(sys.stdin.readline().split()[1])
    while time.time() < start:
        time.sleep(0.01)
    return start


def _stay_until_stop() -> None:
    """Keep the peers serving until the coordinator's STOP line (or its end: EOF), so that the observers, which
    finish after the peers, still find the records on their replicas."""
    sys.stdin.readline()


def worker(args: argparse.Namespace) -> None:
    """Worker process: host ``--peers`` peers, wait for GO, run the steps, print the raw measurements as RESULT."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    # SIGTERM from the coordinator: leave through the finally below, which closes peers and their sockets
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    from swarm.dht import DHTTransport, DHTTransportConfig

    rpc_bytes = count_rpc_bytes() if args.rpc_bytes else None
    peers: list[DHTTransport] = []
    initial = args.initial_peer.split(",") if args.initial_peer else []
    try:
        for _ in range(args.peers):
            # join_timeout: on 2 busy cores a peer hosting others in one process may answer a join late
            config = DHTTransportConfig(
                initial_peers=initial,
                prefetch_groups=2 * args.j,
                model_name="bench",
                join_timeout=120.0,
                **transport_overrides(args.set),
            )
            peer = DHTTransport(config)
            if not peers:  # later peers of this worker join through its first one too: no single busy entry point
                print("ADDR", peer.visible_addresses()[0], flush=True)
                initial = [peer.visible_addresses()[0], *initial][:4]
            peers.append(peer)
        print("READY", json.dumps([p.p2pd_pid for p in peers]), flush=True)
        start = _wait_for_go()
        rng = random.Random(args.worker_index + 1000 * args.phase_seed)
        phase = {p.peer_id: rng.uniform(0, args.interval) for p in peers}
        step = {p.peer_id: 0 for p in peers}
        published: dict[str, float] = {}  # group id -> created_at, for the observers' delivered share
        measures: dict[str, list[float]] = {k: [] for k in ("publish_call", "fetch_call", "fetched", "age")}
        end = start + args.duration
        me = os.getpid()
        io_start = sum(io_bytes(p.p2pd_pid) for p in peers)
        cpu_start = {"python": cpu_seconds(me), "p2pd": sum(cpu_seconds(p.p2pd_pid) for p in peers)}
        counters_start = {p.peer_id: p.readout().counters for p in peers}
        rpc_start = dict(rpc_bytes or {})
        measured_from = time.monotonic()  # background timings before this moment are warm-up
        while time.time() < end:
            now = time.time()
            for p in peers:
                due = start + phase[p.peer_id] + step[p.peer_id] * args.interval
                if now < due or due >= end:
                    continue
                step[p.peer_id] += 1
                groups = make_groups(p.peer_id[:10], step[p.peer_id], rng)
                published.update((g.group_id, g.created_at) for g in groups)
                t = time.perf_counter()
                p.publish(groups)
                measures["publish_call"].append(time.perf_counter() - t)
                t = time.perf_counter()
                got = p.fetch(args.j)
                measures["fetch_call"].append(time.perf_counter() - t)
                if step[p.peer_id] > 2:  # the first steps run before anything was published, or the pace was learnt
                    measures["fetched"].append(len(got))
                    measures["age"].extend(time.time() - item.group.created_at for item in got)
            time.sleep(0.005)
        # CPU and I/O first, at the end of the measured time: what follows (read-outs, JSON) is not the swarm's
        python_cpu = cpu_seconds(me) - cpu_start["python"]
        p2pd_cpu = sum(cpu_seconds(p.p2pd_pid) for p in peers) - cpu_start["p2pd"]
        p2pd_io = sum(io_bytes(p.p2pd_pid) for p in peers) - io_start
        rpc = {k: v - rpc_start.get(k, 0) for k, v in (rpc_bytes or {}).items()}
        timings: dict[str, list[float]] = {}
        for p in peers:
            for name, samples in p.readout().timings.items():
                timings.setdefault(name, []).extend(seconds for at, seconds in samples if at >= measured_from)
        counters: dict[str, int] = {}
        for p in peers:
            before = counters_start[p.peer_id]
            for k, v in p.readout().counters.items():
                counters[k] = counters.get(k, 0) + v - before.get(k, 0)
        result = {
            "peers": len(peers),
            "steps": sum(step.values()),
            "measures": measures,
            "timings": timings,
            "counters": counters,
            "published_groups": published,
            "python_rss_mb": rss_mb(me) or 0.0,
            "p2pd_rss_mb": [rss_mb(p.p2pd_pid) or 0.0 for p in peers],
            # p2pd I/O: TCP to other peers plus the unix socket to this worker's Python (Python's recv/send on
            # that socket do not show in its own /proc io, so the two cannot be told apart here)
            "p2pd_io": p2pd_io,
            # CPU of this worker (all its peers' Python: transport threads and the step loop) and of their daemons
            "python_cpu": python_cpu,
            "p2pd_cpu": p2pd_cpu,
            "healthy": all(p.healthy() for p in peers),
            "rpc_bytes": rpc,
            **topic_view(peers),
        }
        print("RESULT", json.dumps(result), flush=True)
        _stay_until_stop()
    finally:
        for p in peers:
            with contextlib.suppress(Exception):
                p.close()


def topic_view(transports: Sequence[Any]) -> dict[str, list]:
    """Each peer's announcement topic level now and the estimate of N it comes from (one read-out per peer): a peer
    hears another only if their levels differ by at most one (:func:`swarm.levels.publish_topics`)."""
    gauges = [t.readout().gauges for t in transports]
    return {
        "topic_levels": [int(g.get("topic_level", -1)) for g in gauges],
        "estimated_peers": [g.get("estimated_peers", -1.0) for g in gauges],
    }


def observer_worker(args: argparse.Namespace) -> None:
    """Observer process: host ``--peers`` observer peers (client mode, unlisted: they neither store records nor
    count as swarm members), poll ``fetch`` from GO until the end of the run, print each one's delivery log."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    from benchmarks.delivery import DeliveryLog, DeliveryObserver
    from swarm.dht import DHTTransport, DHTTransportConfig

    transports: list[DHTTransport] = []
    observers: list[DeliveryObserver] = []
    try:
        for _ in range(args.peers):
            config = DHTTransportConfig(
                initial_peers=args.initial_peer.split(","),
                client_mode=True,
                announce=False,
                subscribe_topics=0,  # every announcement topic: an observer watches every publisher
                model_name="observer",
                join_timeout=120.0,
                **transport_overrides(args.set),
            )
            transports.append(DHTTransport(config))
        print("READY", json.dumps([t.p2pd_pid for t in transports]), flush=True)
        start = _wait_for_go()
        logs = [DeliveryLog() for _ in transports]
        me = os.getpid()
        cpu_start = cpu_seconds(me) + sum(cpu_seconds(t.p2pd_pid) for t in transports)
        observers = [DeliveryObserver(t, log).start() for t, log in zip(transports, logs, strict=True)]
        while time.time() < start + args.duration:
            time.sleep(0.1)
        for observer in observers:
            observer.stop()
        cpu = cpu_seconds(me) + sum(cpu_seconds(t.p2pd_pid) for t in transports) - cpu_start
        result = {"latencies": [log.latencies for log in logs], "cpu": cpu, **topic_view(transports)}
        print("RESULT", json.dumps(result), flush=True)
        _stay_until_stop()
    finally:
        for observer in observers:
            with contextlib.suppress(Exception):
                observer.stop()
        for t in transports:
            with contextlib.suppress(Exception):
                t.close()


# ------------------------------------------------------------------------------------------------
# coordinator


def level_counts(levels: Iterable[int]) -> dict[str, int]:
    """How many peers are at each topic level, by level (keys are strings: the report is JSON)."""
    counts = collections.Counter(levels)
    return {str(level): counts[level] for level in sorted(counts)}


def delivery_summary(
    latencies: Sequence[dict[str, float]], published: dict[str, float], counted_until: float
) -> dict[str, Any]:
    """Delivery over the observers: latencies pooled (median, p95, max) and the mean delivered share, counting only
    the groups created by ``counted_until`` (each observer then had at least the delivery window to see them, so the
    latencies of late groups are not censored)."""
    from benchmarks.delivery import DeliveryLog, pooled_summary

    counted = {gid for gid, created_at in published.items() if created_at <= counted_until}
    logs = [DeliveryLog({g: s for g, s in lat.items() if g in counted}, set(counted)) for lat in latencies]
    return pooled_summary(logs)


def run_swarm(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Start ``n`` peers over worker processes and the observers, run the steps, aggregate; always stops every
    process."""
    from swarm.daemon import ProcessIdentity

    workers = min(n, 4)
    per_worker = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
    interval = interval_for(n, args)
    duration = duration_for(interval, args)
    procs: list[subprocess.Popen] = []
    p2pd_pids: list[int] = []
    daemons: list[Any] = []  # the same daemons by identity, read while they run: what the last resort may kill
    observer_pids: set[int] = set()

    def spawn(index: int, count: int, initial: str | None, role: str = "--worker") -> subprocess.Popen:
        cmd = [sys.executable, "-m", "benchmarks.swarm_transport", role, "--peers", str(count)]
        cmd += ["--worker-index", str(index), "--duration", str(duration), "--interval", str(interval)]
        cmd += ["--j", str(args.j), "--phase-seed", str(args.phase_seed)]
        cmd += ["--initial-peer", initial] if initial else []
        cmd += [x for setting in args.set for x in ("--set", setting)] + (["--rpc-bytes"] if args.rpc_bytes else [])
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        procs.append(proc)
        return proc

    def read_line(proc: subprocess.Popen, prefix: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker exited (code {proc.poll()}) before {prefix}")
            if line.startswith(prefix + " "):
                return line[len(prefix) + 1 :].strip()
        raise RuntimeError(f"no {prefix} from worker in {timeout} s")

    started = time.monotonic()
    observer_result: dict[str, Any] = {"latencies": [], "cpu": 0.0}
    try:
        # Each worker starts once the previous one's first peer is up and joins through the first peers of all
        # workers so far: 3 workers joining one busy peer at once failed at N = 64 (no ping answer within 3 s)
        addresses = [read_line(spawn(0, per_worker[0], None), "ADDR")]
        for i in range(1, workers):
            addresses.append(read_line(spawn(i, per_worker[i], ",".join(addresses[-3:])), "ADDR"))
        peer_procs = list(procs)
        watcher = spawn(workers, args.observers, ",".join(addresses), "--observer-worker") if args.observers else None
        for proc in procs:
            pids = json.loads(read_line(proc, "READY"))
            p2pd_pids += pids
            daemons += [d for d in map(ProcessIdentity.of, pids) if d is not None]
            if proc is watcher:
                observer_pids.update(pids)
        startup = time.monotonic() - started
        go = time.time() + 2.0
        for proc in procs:
            proc.stdin.write(f"GO {go}\n")
            proc.stdin.flush()
        # TCP bytes of every socket of our daemons at the start and the end of the measured time
        time.sleep(max(0.0, go - time.time()))
        sockets_start = tcp_sockets(set(p2pd_pids))
        time.sleep(max(0.0, go + duration - time.time()))
        tcp = tcp_traffic(sockets_start, tcp_sockets(set(p2pd_pids)), observer_pids)
        results = [json.loads(read_line(proc, "RESULT", duration + 120)) for proc in peer_procs]
        if watcher is not None:
            observer_result = json.loads(read_line(watcher, "RESULT", 120))
        for proc in procs:
            proc.stdin.write("STOP\n")
            proc.stdin.flush()
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        stop_processes(procs, grace=20, daemons=daemons)  # the daemons of a worker that died, as a last resort

    def merged(section: str, key: str) -> list[float]:
        return [v for r in results for v in r[section].get(key, [])]

    def ms(values: list[float]) -> dict[str, Any]:
        return {k: v * 1e3 if isinstance(v, float) else v for k, v in summary(values).items()}

    steps = sum(r["steps"] for r in results)
    counters: dict[str, int] = {}
    for r in results:
        for k, v in r["counters"].items():
            counters[k] = counters.get(k, 0) + v
    fetched = merged("measures", "fetched")
    p2pd_rss = [v for r in results for v in r["p2pd_rss_mb"]]
    published = {gid: t for r in results for gid, t in r["published_groups"].items()}
    payload = counters.get("published_bytes", 0) + counters.get("fetched_bytes", 0)
    # Serving an observer's lookup costs a peer's p2pd about twice the bytes sent to it (the answer read from its
    # Python, then written to TCP): p2pd I/O without the observers is estimated by taking that off.
    p2pd_io = sum(r["p2pd_io"] for r in results) - 2 * tcp["observers"]
    python_cpu, p2pd_cpu = sum(r["python_cpu"] for r in results), sum(r["p2pd_cpu"] for r in results)
    rpc_bytes: dict[str, float] = {}
    for r in results:
        for k, v in r.get("rpc_bytes", {}).items():
            rpc_bytes[k] = rpc_bytes.get(k, 0) + v
    return {
        "peers": n,
        "workers": workers,
        "interval": interval,
        "duration": duration,
        "startup_seconds": startup,
        "steps": steps,
        "steps_per_peer": steps / n,
        "publish_call_ms": ms(merged("measures", "publish_call")),
        "fetch_call_ms": ms(merged("measures", "fetch_call")),
        "store_seconds": summary(merged("timings", "publish")),
        "record_lookup_seconds": summary(merged("timings", "fetch")),
        "index_read_seconds": summary(merged("timings", "index")),
        # the reader's own timing: from a record's creation to its groups entering a (consuming) peer's cache
        "delivery_seconds": summary(merged("timings", "delivery")),
        "observed_delivery": delivery_summary(
            observer_result["latencies"], published, go + duration - args.delivery_window
        ),
        "observers": args.observers,
        "observer_cpu_seconds": observer_result["cpu"],
        # how many peers (observers) ended at each announcement topic level
        "topic_levels": level_counts(level for r in results for level in r.get("topic_levels", [])),
        "observer_topic_levels": level_counts(observer_result.get("topic_levels", [])),
        # each peer's estimate of N at the end, which sets its topic level
        "estimated_peers": sorted(round(e, 1) for r in results for e in r.get("estimated_peers", [])),
        "group_age_at_fetch_seconds": summary(merged("measures", "age")),
        "fill_rate": (sum(fetched) / (len(fetched) * args.j)) if fetched else None,
        "published_bytes_per_peer_step": counters.get("published_bytes", 0) / max(steps, 1),
        "fetched_bytes_per_peer_step": counters.get("fetched_bytes", 0) / max(steps, 1),
        "p2pd_io_bytes_per_peer_step": p2pd_io / max(steps, 1),
        # bytes sent + received over TCP between peers (each network byte counted at both ends)
        "tcp_bytes_per_peer_step": tcp["peers"] / max(steps, 1),
        "tcp": tcp,
        # p2pd I/O over the payload the peers published + fetched; the TCP bytes halved = bytes on the network
        "p2pd_io_to_payload": p2pd_io / payload if payload else None,
        "network_to_payload": tcp["peers"] / 2 / payload if payload else None,
        # a worker's Python CPU is shared by its peers: the total over total steps is the mean per peer and step
        "python_cpu_seconds_per_peer_step": python_cpu / max(steps, 1),
        "p2pd_cpu_seconds_per_peer_step": p2pd_cpu / max(steps, 1),
        "swarm_cpu_cores": (python_cpu + p2pd_cpu) / duration,
        "python_rss_mb_per_peer": sum(r["python_rss_mb"] for r in results) / n,
        "p2pd_rss_mb_per_peer": statistics.mean(p2pd_rss) if p2pd_rss else None,
        "counters": counters,
        # what the protocol did per peer and step: announcements, index reads and stores, hedges, departures
        "per_peer_step": {
            name: counters.get(name, 0) / max(steps, 1)
            for name in (
                "announcements_sent",
                "announcements_received",
                "index_reads",
                "index_stores",
                "index_bytes_read",
                "fetched_records",
                "hedged_fetches",
                "fetch_failures",
                "departed_senders",
                "announcement_bytes",
                "topic_level_changes",
            )
        },  # fmt: skip
        # --rpc-bytes: protobuf bytes of the DHT requests the peers served and their answers, per peer and step
        "rpc_bytes_per_peer_step": {k: v / max(steps, 1) for k, v in sorted(rpc_bytes.items())},
        "all_healthy": all(r["healthy"] for r in results),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Run every N (or one worker, with ``--worker``), write the report, print the notes; returns the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 2, 8 with short runs")
    parser.add_argument("--sizes", type=int, nargs="*", default=None, help="peer counts (default 2 8 32 64)")
    parser.add_argument("--duration", type=float, default=None, help="least measured seconds per N")
    parser.add_argument("--interval", type=float, default=3.0, help="least seconds between two steps of a peer")
    parser.add_argument(
        "--per-peer-seconds",
        type=float,
        default=PER_PEER_SECONDS,
        help="step interval per peer: a step lasts max(--interval, N x this), the swarm's load constant in N",
    )
    parser.add_argument(
        "--fixed-interval", action="store_true", help="every N steps every --interval s (the load grows with N)"
    )
    parser.add_argument(
        "--phase-seed",
        type=int,
        default=0,
        help="seed of the peers' step phases (each peer steps at a random offset within the step): runs with other "
        "seeds show how much a figure owes to one layout of the steps, which at small N is few",
    )
    parser.add_argument("--min-steps", type=int, default=6, help="least steps per peer before the delivery window")
    parser.add_argument("--observers", type=int, default=2, help="observer peers measuring delivery latency")
    parser.add_argument(
        "--delivery-window",
        type=float,
        default=45.0,
        help="seconds before the end after which groups are not counted in the delivery figures",
    )
    parser.add_argument("--j", type=int, default=4, help="external groups fetched per step")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a DHTTransportConfig field for every peer"
    )
    parser.add_argument(
        "--rpc-bytes", action="store_true", help="count the DHT RPC bytes the peers serve, by kind (a diagnostic)"
    )
    parser.add_argument(
        "--rewrite-report",
        type=Path,
        default=None,
        metavar="JSON",
        help="write the .md/.png again from a run's JSON with this version's notes (measures nothing)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the report goes")
    parser.add_argument("--no-write", action="store_true", help="print the report only")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--observer-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--initial-peer", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 15.0 if args.quick else 60.0
    if args.worker:
        worker(args)
        return None
    if args.observer_worker:
        observer_worker(args)
        return None
    if args.rewrite_report is not None:
        report = json.loads(args.rewrite_report.read_text())
        # a run's own notes (sizes skipped or failed) stay; the explanations are this version's
        report["notes"] = [note for note in report["notes"] if note.startswith("- N=")] + NOTES
        write_outputs(report, args.results_dir)
        return report
    record = run_record()  # at the start: the commit the measured code ran on
    sizes = args.sizes or ([2, 8] if args.quick else [2, 8, 32, 64])
    runs, notes = [], []
    for n in sizes:
        if runs:  # stop early if the next size would not fit in memory with a 30 % margin
            # the workers' Python (a fixed number of processes) plus one p2pd per peer and observer, and the
            # observers' process
            last = runs[-1]
            workers_mb = last["python_rss_mb_per_peer"] * last["peers"] + 350
            need = (workers_mb + last["p2pd_rss_mb_per_peer"] * (n + args.observers)) * 2**20
            available = meminfo_bytes("MemAvailable")
            if need > 0.7 * available:
                notes.append(f"- N={n} skipped: needs ~{need / 2**30:.1f} GiB, {available / 2**30:.1f} available")
                break
        print(f"running N={n} (interval {interval_for(n, args):.1f} s) ...", flush=True)
        try:
            run = run_swarm(n, args)
        except RuntimeError as e:  # a size that fails (e.g. peers cannot join) ends the series; the rest is reported
            notes.append(f"- N={n} failed: {e}")
            print(f"N={n} failed: {e}", flush=True)
            break
        runs.append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "counters"}, indent=None), flush=True)
    notes += NOTES
    load = "fixed" if args.fixed_interval else f"max({args.interval:g}, N x {args.per_peer_seconds:g}) s"
    report = {
        **record,
        "setup": "peers are DHTTransport objects in min(N, 4) worker processes (one p2pd each), loopback; each peer "
        f"steps every {load} (interval per N in the table): it publishes 4 groups x 8 completions x 1500 chars and "
        f"fetches J={args.j}; {args.observers} observer peer(s) in their own process; at least {args.duration:g} s "
        f"and {args.min_steps} steps per peer + a {args.delivery_window:g} s delivery window measured per N",
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "observer_worker", "peers")},
        "j": args.j,
        "interval": args.interval,
        "per_peer_seconds": None if args.fixed_interval else args.per_peer_seconds,
        "duration": args.duration,
        "runs": runs,
        "notes": notes,
    }
    if not args.no_write:
        write_outputs(report, args.results_dir)
    print("\n".join(notes))
    return report


if __name__ == "__main__":
    main()
