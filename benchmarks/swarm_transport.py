"""Benchmark of the hivemind DHT transport: publish/fetch latency, bytes and memory per peer for N peers.

DHT-only peers (no model) on 127.0.0.1. Peers run as ``DHTTransport`` objects spread over worker
processes (``min(N, 4)`` workers, each hosting ``N / workers`` peers, each peer with its own p2pd), the
way one machine allows: one Python process per peer would cost ~300 MB each (hivemind imports torch).
Every peer publishes a realistic record (4 groups x 8 completions x ~1500 characters) every
``--interval`` seconds and fetches J groups of others per step.

Usage:
    python benchmarks/swarm_transport.py            # N = 2, 8, 32, 64 (64 only if memory allows)
    python benchmarks/swarm_transport.py --quick    # N = 2, 8, short runs

Writes benchmarks/results/swarm_transport.{json,md,png}. Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository's packages come first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import (  # noqa: E402
    RESULTS,
    ROOT,
    cpu_seconds,
    meminfo_bytes,
    pyplot,
    rss_mb,
    run_record,
    stop_processes,
    write_report,
)


def io_bytes(pid: int) -> int:
    """Bytes ``pid`` read plus wrote through system calls (sockets included)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            fields = dict(line.split(":") for line in f)
        return int(fields["rchar"]) + int(fields["wchar"])
    except (OSError, KeyError, ValueError):
        return 0


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (nearest rank); None when empty."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summary(values: list[float]) -> dict[str, float | None]:
    """Median, 95th percentile and count of ``values``."""
    return {"median": statistics.median(values) if values else None, "p95": percentile(values, 0.95), "n": len(values)}


# ------------------------------------------------------------------------------------------------
# worker process: hosts some peers, runs the steps, reports raw measurements as JSON


def make_groups(peer: str, step: int, rng: random.Random) -> list:
    """4 groups of 8 completions of ~1500 characters: a realistic record to publish."""
    from swarm.records import Group, Provenance

    words = "the of and to in is that for it as with was on be by this are or at from".split()
    return [
        Group(
            group_id=f"{step}-{g}",
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


def worker(args: argparse.Namespace) -> None:
    """Worker process: host ``--peers`` peers, wait for GO, run the steps, print the raw measurements as RESULT."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    # SIGTERM from the coordinator: leave through the finally below, which closes peers and their sockets
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    from swarm.dht import DHTTransport, DHTTransportConfig

    peers: list[DHTTransport] = []
    initial = [args.initial_peer] if args.initial_peer else []
    try:
        for _ in range(args.peers):
            config = DHTTransportConfig(initial_peers=initial, prefetch_groups=2 * args.j, model_name="bench")
            peer = DHTTransport(config)
            peers.append(peer)
            if not initial:
                initial = peer.visible_addresses()
                print("ADDR", initial[0], flush=True)
        print("READY", json.dumps([p.p2pd_pid for p in peers]), flush=True)
        start = float(sys.stdin.readline().split()[1])
        rng = random.Random(args.worker_index)
        phase = {p.peer_id: rng.uniform(0, args.interval) for p in peers}
        step = {p.peer_id: 0 for p in peers}
        measures: dict[str, list[float]] = {k: [] for k in ("publish_call", "fetch_call", "fetched", "age")}
        while time.time() < start:
            time.sleep(0.01)
        end = start + args.duration
        io_start = {p.peer_id: io_bytes(p.p2pd_pid) for p in peers}
        cpu_start = {"python": cpu_seconds(os.getpid()), "p2pd": sum(cpu_seconds(p.p2pd_pid) for p in peers)}
        counters_start = {p.peer_id: p.readout().counters for p in peers}
        measured_from = time.monotonic()  # background timings before this moment are warm-up
        while time.time() < end:
            now = time.time()
            for p in peers:
                due = start + phase[p.peer_id] + step[p.peer_id] * args.interval
                if now < due:
                    continue
                step[p.peer_id] += 1
                groups = make_groups(p.peer_id, step[p.peer_id], rng)
                t = time.perf_counter()
                p.publish(groups)
                measures["publish_call"].append(time.perf_counter() - t)
                t = time.perf_counter()
                got = p.fetch(args.j)
                measures["fetch_call"].append(time.perf_counter() - t)
                if step[p.peer_id] > 2:  # the first steps run before anything was published
                    measures["fetched"].append(len(got))
                measures["age"].extend(time.time() - item.group.created_at for item in got)
            time.sleep(0.005)
        timings: dict[str, list[float]] = {}
        for p in peers:
            for name, samples in p.readout().timings.items():
                timings.setdefault(name, []).extend(seconds for at, seconds in samples if at >= measured_from)
        counters = {}
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
            "python_rss_mb": rss_mb(os.getpid()) or 0.0,
            "p2pd_rss_mb": [rss_mb(p.p2pd_pid) or 0.0 for p in peers],
            "p2pd_io": sum(io_bytes(p.p2pd_pid) - io_start[p.peer_id] for p in peers),
            # CPU of this worker (all its peers' Python: transport threads and the step loop) and of their daemons
            "python_cpu": cpu_seconds(os.getpid()) - cpu_start["python"],
            "p2pd_cpu": sum(cpu_seconds(p.p2pd_pid) for p in peers) - cpu_start["p2pd"],
            "healthy": all(p.healthy() for p in peers),
        }
        print("RESULT", json.dumps(result), flush=True)
    finally:
        for p in peers:
            with contextlib.suppress(Exception):
                p.close()


# ------------------------------------------------------------------------------------------------
# coordinator


def run_swarm(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Start ``n`` peers over worker processes, run the steps, aggregate; always stops every process."""
    workers = min(n, 4)
    per_worker = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
    procs: list[subprocess.Popen] = []
    p2pd_pids: list[int] = []

    def spawn(index: int, count: int, initial: str | None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "benchmarks.swarm_transport", "--worker", "--peers", str(count)]
        cmd += ["--worker-index", str(index), "--duration", str(args.duration), "--interval", str(args.interval)]
        cmd += ["--j", str(args.j)] + (["--initial-peer", initial] if initial else [])
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
    try:
        first = spawn(0, per_worker[0], None)
        address = read_line(first, "ADDR")
        for i in range(1, workers):
            spawn(i, per_worker[i], address)
        for proc in procs:
            p2pd_pids += json.loads(read_line(proc, "READY"))
        startup = time.monotonic() - started
        go = time.time() + 2.0
        for proc in procs:
            proc.stdin.write(f"GO {go}\n")
            proc.stdin.flush()
        results = [json.loads(read_line(proc, "RESULT", args.duration + 120)) for proc in procs]
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        stop_processes(procs, grace=20, daemons=p2pd_pids)  # the daemons of a worker that died, as a last resort

    def merged(section: str, key: str) -> list[float]:
        return [v for r in results for v in r[section].get(key, [])]

    steps = sum(r["steps"] for r in results)
    counters: dict[str, int] = {}
    for r in results:
        for k, v in r["counters"].items():
            counters[k] = counters.get(k, 0) + v
    fetched = merged("measures", "fetched")
    p2pd_rss = [v for r in results for v in r["p2pd_rss_mb"]]
    return {
        "peers": n,
        "workers": workers,
        "startup_seconds": startup,
        "steps": steps,
        "publish_call_ms": {
            k: v * 1e3 if isinstance(v, float) else v for k, v in summary(merged("measures", "publish_call")).items()
        },
        "fetch_call_ms": {
            k: v * 1e3 if isinstance(v, float) else v for k, v in summary(merged("measures", "fetch_call")).items()
        },
        "store_seconds": summary(merged("timings", "publish")),
        "record_lookup_seconds": summary(merged("timings", "fetch")),
        "index_read_seconds": summary(merged("timings", "index")),
        "delivery_seconds": summary(merged("timings", "delivery")),
        "group_age_at_fetch_seconds": summary(merged("measures", "age")),
        "fill_rate": (sum(fetched) / (len(fetched) * args.j)) if fetched else None,
        "published_bytes_per_peer_step": counters.get("published_bytes", 0) / max(steps, 1),
        "fetched_bytes_per_peer_step": counters.get("fetched_bytes", 0) / max(steps, 1),
        "p2pd_io_bytes_per_peer_step": sum(r["p2pd_io"] for r in results) / max(steps, 1),
        "python_cpu_seconds_per_peer_step": sum(r.get("python_cpu", 0.0) for r in results) / max(steps, 1),
        "p2pd_cpu_seconds_per_peer_step": sum(r.get("p2pd_cpu", 0.0) for r in results) / max(steps, 1),
        "python_rss_mb_per_peer": sum(r["python_rss_mb"] for r in results) / n,
        "p2pd_rss_mb_per_peer": statistics.mean(p2pd_rss) if p2pd_rss else None,
        "counters": counters,
        "all_healthy": all(r["healthy"] for r in results),
    }


def write_outputs(report: dict[str, Any], out: Path = RESULTS) -> None:
    """swarm_transport.json, .md (one row per N) and .png (caller and background latencies) in ``out``."""
    rows = report["runs"]
    lines = [
        "# Swarm transport benchmark (hivemind DHT, loopback)",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{report['git_commit']}`, {report['date']}, {report['machine']}  ",
        f"Setup: {report['setup']}",
        "",
        "| N | publish() ms median / p95 | fetch() ms median / p95 | store s median / p95 | record lookup s "
        "median / p95 | index read s median / p95 | delivery s median / p95 | fill rate (J) | group age at fetch s "
        "| published KB/peer/step "
        "| fetched KB/peer/step | p2pd I/O KB/peer/step | CPU s/peer/step python + p2pd | python MB/peer "
        "| p2pd MB/peer | failures |",
        "|---" * 16 + "|",
    ]

    def pair(d: dict[str, Any], fmt: str = "{:.3f}") -> str:
        if d.get("median") is None:
            return "-"
        return f"{fmt.format(d['median'])} / {fmt.format(d['p95'])}"

    for r in rows:
        c = r["counters"]
        failures = c.get("publish_failures", 0) + c.get("fetch_failures", 0) + c.get("publish_dropped", 0)
        lines.append(
            f"| {r['peers']} | {pair(r['publish_call_ms'])} | {pair(r['fetch_call_ms'])} | {pair(r['store_seconds'])} "
            f"| {pair(r['record_lookup_seconds'])} | {pair(r['index_read_seconds'])} "
            f"| {pair(r.get('delivery_seconds', {}))} "
            f"| {r['fill_rate'] if r['fill_rate'] is None else round(r['fill_rate'], 2)} "
            f"| {pair(r['group_age_at_fetch_seconds'], '{:.1f}')} "
            f"| {r['published_bytes_per_peer_step'] / 1e3:.1f} | {r['fetched_bytes_per_peer_step'] / 1e3:.1f} "
            f"| {r['p2pd_io_bytes_per_peer_step'] / 1e3:.1f} "
            f"| {r.get('python_cpu_seconds_per_peer_step', 0):.3f} + {r.get('p2pd_cpu_seconds_per_peer_step', 0):.3f} "
            f"| {r['python_rss_mb_per_peer']:.0f} "
            f"| {r['p2pd_rss_mb_per_peer']:.0f} | {failures} |"
        )
    lines += ["", *report["notes"]]
    write_report(out, "swarm_transport", report, lines)

    plt = pyplot()
    ns = [r["peers"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in [("fetch_call_ms", "fetch() call (ms)"), ("publish_call_ms", "publish() call (ms)")]:
        ax1.plot(ns, [r[key]["median"] for r in rows], "o-", label=f"{label} median")
        ax1.plot(ns, [r[key]["p95"] for r in rows], "x--", label=f"{label} p95")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("peers N")
    ax1.set_ylabel("ms (caller side, never on the network)")
    ax1.set_title("Caller latency")
    ax1.legend(fontsize=7)
    for key, label in [
        ("record_lookup_seconds", "record lookup"),
        ("index_read_seconds", "index read"),
        ("store_seconds", "store"),
    ]:
        ax2.plot(ns, [r[key]["median"] for r in rows], "o-", label=f"{label} median")
        ax2.plot(ns, [r[key]["p95"] for r in rows], "x--", label=f"{label} p95")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("peers N")
    ax2.set_ylabel("seconds (background thread)")
    ax2.set_title(f"Background DHT operations (J={report['j']})")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "swarm_transport.png", dpi=120)
    plt.close(fig)


def main() -> None:
    """Run every N (or one worker, with ``--worker``), write the report, print the notes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 2, 8 with short runs")
    parser.add_argument("--sizes", type=int, nargs="*", default=None, help="peer counts (default 2 8 32 64)")
    parser.add_argument("--duration", type=float, default=None, help="measured seconds per N")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between two steps of a peer")
    parser.add_argument("--j", type=int, default=4, help="external groups fetched per step")
    parser.add_argument("--no-write", action="store_true", help="print the report only")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--initial-peer", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.duration is None:
        args.duration = 15.0 if args.quick else 40.0
    if args.worker:
        worker(args)
        return
    record = run_record()  # at the start: the commit the measured code ran on
    sizes = args.sizes or ([2, 8] if args.quick else [2, 8, 32, 64])
    runs, notes = [], []
    for n in sizes:
        if runs:  # stop early if the next size would not fit in memory with a 30 % margin
            last = runs[-1]
            per_peer = (last["python_rss_mb_per_peer"] + last["p2pd_rss_mb_per_peer"]) * 2**20
            need = per_peer * n + 4 * 350 * 2**20
            available = meminfo_bytes("MemAvailable")
            if need > 0.7 * available:
                notes.append(f"- N={n} skipped: needs ~{need / 2**30:.1f} GiB, {available / 2**30:.1f} available")
                break
        print(f"running N={n} ...", flush=True)
        run = run_swarm(n, args)
        runs.append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "counters"}, indent=None), flush=True)
    notes += [
        "- publish()/fetch(): time the caller spends (never on the network). store / record lookup / index read:",
        "  the background thread's DHT operations. fill rate: groups fetch(J) returned / J after the first steps.",
        "- group age at fetch: seconds from a group's creation to the fetch() that returned it (includes the step",
        "  interval the fetching peer waits), i.e. how stale external groups are.",
        "- p2pd I/O: bytes p2pd read + wrote in system calls (TCP to peers plus its local socket to Python: about",
        "  twice the network traffic). python MB/peer: worker RSS divided by its peers (each worker imports torch",
        "  through hivemind: ~290 MB shared by its peers).",
        "- hivemind stores every record on its num_replicas=5 nearest peers (the publisher included): for N <= 5",
        "  every peer holds every record and lookups are local; from N = 8 on they cross the network.",
        "- All peers share 2 CPU cores: at large N the background latencies also measure CPU contention.",
    ]
    report = {
        **record,
        "setup": "peers are DHTTransport objects in min(N, 4) worker processes (one p2pd each), loopback; every "
        f"{args.interval:.0f} s each peer publishes 4 groups x 8 completions x 1500 chars and fetches J={args.j}; "
        f"{args.duration:.0f} s measured per N",
        "j": args.j,
        "interval": args.interval,
        "duration": args.duration,
        "runs": runs,
        "notes": notes,
    }
    if not args.no_write:
        write_outputs(report)
    print("\n".join(notes))


if __name__ == "__main__":
    main()
