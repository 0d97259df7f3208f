"""Benchmark of the hivemind DHT transport over WAN-like links: delivery latency, fill rate and a host's dropout.

Every peer runs on its own network-namespace host (:class:`testbed.netns.Hosts`) behind a link of the userspace
switch :mod:`testbed.wan_switch` (this kernel has no ``netem``): per host a one-way delay drawn from 20-150 ms,
1 % loss per direction and a bandwidth drawn from 10-20 Mbit/s. Publisher hosts run one model-less
``DHTTransport`` each, which publishes a realistic record (4 groups x 8 completions x ~1500 characters) every
``--interval`` seconds and fetches J groups per step (as benchmarks/swarm_transport.py does); observer hosts run
one peer each that publishes nothing and measures delivery latency (:mod:`benchmarks.delivery`).

One swarm, joined under WAN links, goes through three phases (the switch changes the links at run time):
``wan``, ``no delay`` (the same switch with perfect links: what the switch itself adds), and ``wan + dropout``,
where one publishing host's link is cut for ``--cut`` seconds and restored. Before the swarm starts, a TCP bulk
transfer through the switch measures its own forwarding capacity on this machine.

Usage:
    python -m benchmarks.transport_wan            # 6 publishers + 2 observers, ~12 minutes
    python -m benchmarks.transport_wan --quick    # 3 + 1, short phases (a smoke run)

Writes benchmarks/results/transport_wan.{json,md,png}. Needs root and iproute2. Every process and namespace it
creates is removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, ROOT, percentile, run_record, stop_processes
from benchmarks.transport_wan_report import write_outputs
from testbed.netns import Hosts
from testbed.wan_switch import Link, SwitchProcess

FAILURES = ("publish_failures", "fetch_failures", "publish_dropped", "index_store_failures")


# ------------------------------------------------------------------------------------------------
# worker process: one peer on one namespace host


def worker(args: argparse.Namespace) -> None:
    """Worker: one peer (publisher or observer) on this host; waits for GO, runs until the end, prints RESULT."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # SIGTERM from the coordinator: leave through the finally below, which closes the peer and its p2pd
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    from benchmarks.delivery import DeliveryLog, DeliveryObserver
    from benchmarks.swarm_transport import make_groups
    from swarm.dht import DHTTransport, DHTTransportConfig

    observer = args.role == "observer"
    config = DHTTransportConfig(
        swarm_name="wan",
        initial_peers=[args.initial_peer] if args.initial_peer else [],
        host_maddrs=[f"/ip4/{args.address}/tcp/0"],
        # an observer keeps every group it can get: its delivered share must not be capped by its cache
        prefetch_groups=256 if observer else 2 * args.j,
        model_name="bench",
        announce=not observer,  # observers publish nothing: readers need not list them
        subscribe_topics=0 if observer else 1,  # an observer hears every announcement topic
    )
    peer = None
    try:
        peer = DHTTransport(config)
        if not args.initial_peer:
            print("ADDR", peer.visible_addresses()[0], flush=True)
        print("READY", json.dumps([peer.p2pd_pid]), flush=True)
        _, start, end = sys.stdin.readline().split()
        start, end = float(start), float(end)
        while time.time() < start:
            time.sleep(0.01)
        log = DeliveryLog()
        watcher = DeliveryObserver(peer, log).start() if observer else None
        rng = random.Random(args.host)
        due = start + rng.uniform(0, args.interval)
        step, steps, published, snapshots, ages = 0, [], [], [], []
        next_snapshot = start
        while time.time() < end:
            now = time.time()
            if now >= next_snapshot:  # counters every 5 s: the coordinator attributes failures to phases
                snapshots.append([now, peer.readout().counters])
                next_snapshot += 5.0
            if not observer and now >= due:
                step += 1
                due += args.interval
                groups = [
                    dataclasses.replace(g, group_id=f"h{args.host}-{g.group_id}")  # unique across hosts
                    for g in make_groups(peer.peer_id, step, rng)
                ]
                peer.publish(groups)
                published += [[g.group_id, g.created_at] for g in groups]
                got = peer.fetch(args.j)
                steps.append([time.time(), len(got)])
                ages += [[time.time(), time.time() - item.group.created_at] for item in got]
            time.sleep(0.01)
        if watcher is not None:
            watcher.stop()
        snapshots.append([time.time(), peer.readout().counters])
        result = {
            "role": args.role,
            "host": args.host,
            "peer_id": peer.peer_id,
            "steps": steps,
            "published": published,
            "latencies": log.latencies,
            "ages": ages,
            "snapshots": snapshots,
            "healthy": peer.healthy(),
        }
        print("RESULT", json.dumps(result), flush=True)
    finally:
        if peer is not None:
            with contextlib.suppress(Exception):
                peer.close()


# ------------------------------------------------------------------------------------------------
# the switch's own capacity

SINK = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 9100)); s.listen()
print("ready", flush=True)
c, _ = s.accept(); n = 0
while True:
    data = c.recv(1 << 16)
    if not data:
        break
    n += len(data)
c.sendall(str(n).encode()); c.close()
"""

SOURCE = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 9100), timeout=60); t = time.monotonic()
s.sendall(b"x" * int(sys.argv[2])); s.shutdown(socket.SHUT_WR)
n = int(s.recv(100)); print(n, time.monotonic() - t)
"""


def switch_capacity(hosts: Hosts, switch: SwitchProcess, size: int = 20_000_000) -> dict[str, Any]:
    """TCP bulk transfer host 0 -> host 1 through the switch with perfect links: its forwarding rate here."""
    sink = subprocess.Popen(
        ["ip", "netns", "exec", hosts.names[1], sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True
    )
    try:
        sink.stdout.readline()
        time.sleep(1.1)  # the stats file is rewritten every second: read CPU time from a fresh one
        before = switch.stats()
        command = ["ip", "netns", "exec", hosts.names[0], sys.executable, "-c", SOURCE, hosts.address(1), str(size)]
        received, seconds = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout.split()
        time.sleep(1.1)
        after = switch.stats()
    finally:
        sink.kill()  # `ip netns exec` execs Python: this is the sink's own PID
        sink.wait(timeout=10)
    frames = sum(p["tx"] for p in after["ports"].values()) - sum(p["tx"] for p in before["ports"].values())
    return {
        "bytes": int(received),
        "seconds": float(seconds),
        "mbit_per_s": int(received) * 8 / float(seconds) / 1e6,
        "frames_per_s": frames / float(seconds),
        "switch_cpu_s": after["cpu_s"] - before["cpu_s"],
    }


# ------------------------------------------------------------------------------------------------
# coordinator


def draw_links(count: int, rng: random.Random, loss: float) -> list[Link]:
    """WAN-like links: one-way delay 20-150 ms, ``loss`` per direction, 10-20 Mbit/s (250 ms of queue)."""
    return [
        Link(delay_ms=round(rng.uniform(20, 150), 1), loss=loss, rate_mbit=round(rng.uniform(10, 20), 1))
        for _ in range(count)
    ]


def run_swarm(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Make the hosts and switch, run the workers through the phases; always removes what it made."""
    from swarm.daemon import ProcessIdentity

    publishers, total = args.hosts, args.hosts + args.observers
    links = draw_links(total, random.Random(args.seed), args.loss)
    hosts = Hosts(total, userspace=True)
    procs: list[subprocess.Popen] = []
    daemons: list[Any] = []  # each worker's daemons by identity, read while they run: what the last resort may kill
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def spawn(i: int, initial: str | None) -> subprocess.Popen:
        role = "publisher" if i < publishers else "observer"
        cmd = [sys.executable, "-m", "benchmarks.transport_wan", "--worker", "--role", role, "--host", str(i)]
        cmd += ["--address", hosts.address(i), "--interval", str(args.interval), "--j", str(args.j)]
        cmd += ["--initial-peer", initial] if initial else []
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(logs / f"host{i}.log", "w") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", hosts.names[i], *cmd],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                cwd=ROOT,
                env=env,
            )
        procs.append(proc)
        return proc

    def read_line(proc: subprocess.Popen, prefix: str) -> str:
        while True:  # bounded by the workers' own timeouts (join_timeout) and their end time
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker exited (code {proc.poll()}) before {prefix}; logs in {logs}")
            if line.startswith(prefix + " "):
                return line[len(prefix) + 1 :].strip()

    try:
        hosts.create()
        switch = hosts.start_switch(workdir / "switch", seed=args.seed)
        capacity = switch_capacity(hosts, switch)
        print("switch capacity", json.dumps(capacity), flush=True)
        switch.set_links(dict(enumerate(links)))
        started = time.monotonic()
        first = spawn(0, None)
        address = read_line(first, "ADDR")
        for i in range(1, total):
            spawn(i, address)
        for proc in procs:
            daemons += [d for d in map(ProcessIdentity.of, json.loads(read_line(proc, "READY"))) if d is not None]
        startup = time.monotonic() - started
        print(f"{total} peers joined in {startup:.0f} s", flush=True)

        dropout = publishers - 1  # not the bootstrap peer (host 0): the cut host is an ordinary peer
        p = args.phase
        plan = [  # (offset, event, links to set)
            (p, "no delay", {i: Link() for i in range(total)}),
            (2 * p, "wan + dropout", dict(enumerate(links))),
            (2 * p + args.before_cut, "cut", {dropout: dataclasses.replace(links[dropout], up=False)}),
            (2 * p + args.before_cut + args.cut, "restore", {dropout: links[dropout]}),
        ]
        go = time.time() + 2.0
        end = go + 2 * p + args.before_cut + args.cut + args.after
        for proc in procs:
            proc.stdin.write(f"GO {go} {end}\n")
            proc.stdin.flush()
        events = {"wan": go}
        time.sleep(max(0.0, go - time.time()))
        switch_at: dict[str, dict[str, Any]] = {"wan": switch.stats()}
        for offset, event, changes in plan:
            time.sleep(max(0.0, go + offset - time.time()))
            switch_at[event] = switch.stats()
            switch.set_links(changes)
            events[event] = time.time()  # once the switch acknowledged it
            print(f"{event} at +{events[event] - go:.1f} s", flush=True)
        events["end"] = end
        results = [json.loads(read_line(proc, "RESULT")) for proc in procs]
        switch_at["end"] = switch.stats()
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        stop_processes(procs, grace=20, daemons=daemons)  # the daemons of a worker that died, as a last resort
        hosts.remove()
    return {
        "links": [dataclasses.asdict(link) for link in links],
        "capacity": capacity,
        "startup_seconds": startup,
        "events": events,
        "dropout_host": dropout,
        "switch": switch_at,
        "results": results,
        "warnings": log_warnings(logs),
    }


def log_warnings(logs: Path, top: int = 12) -> list[list[Any]]:
    """The most frequent WARN(ING)/ERROR messages of the workers' logs (numbers and ids blanked), with counts."""
    counts: Counter[str] = Counter()
    for path in logs.glob("host*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if " WARN" in line or " ERROR " in line:  # hivemind's own log format writes WARN
                message = line.split(" ", 2)[-1]  # drop the date and time
                counts[re.sub(r"\b[0-9a-f]{16,}\b|[0-9A-Za-z]{20,}|\d+(\.\d+)?", "#", message)[:200]] += 1
    return [[message, n] for message, n in counts.most_common(top)]


# ------------------------------------------------------------------------------------------------
# analysis


def failures_between(result: dict[str, Any], start: float, end: float) -> dict[str, int]:
    """Failure counters of one worker accumulated between the snapshots nearest ``start`` and ``end``."""
    snapshots = result["snapshots"]

    def at(t: float) -> dict[str, int]:
        return min(snapshots, key=lambda s: abs(s[0] - t))[1]

    before, after = at(start), at(end)
    return {k: after.get(k, 0) - before.get(k, 0) for k in (*FAILURES, "rejoin_attempts", "rejoins")}


def window_stats(
    run: dict[str, Any], start: float, end: float, j: int, hosts: set[int] | None = None
) -> dict[str, Any]:
    """Delivery and fill figures for groups created (and steps taken) in ``[start, end)`` by ``hosts`` (all)."""
    publishers = [r for r in run["results"] if r["role"] == "publisher" and (hosts is None or r["host"] in hosts)]
    observers = [r for r in run["results"] if r["role"] == "observer"]
    created = {gid: t for r in publishers for gid, t in r["published"] if start <= t < end}
    latencies, shares = [], []
    for o in observers:
        seen = [o["latencies"][gid] for gid in created if gid in o["latencies"]]
        latencies += seen
        shares.append(len(seen) / len(created) if created else None)
    fetched = [got for r in publishers for t, got in r["steps"] if start <= t < end]
    ages = [age for r in publishers for t, age in r.get("ages", []) if start <= t < end]
    failures: Counter[str] = Counter()
    for r in run["results"]:
        if hosts is None or r["host"] in hosts or r["role"] == "observer":
            failures.update(failures_between(r, start, end))
    known = [s for s in shares if s is not None]
    return {
        "groups_published": len(created),
        "latency_median_s": percentile(latencies, 0.5),
        "latency_p95_s": percentile(latencies, 0.95),
        "delivered_share": sum(known) / len(known) if known else None,
        "fill_rate": sum(fetched) / (len(fetched) * j) if fetched else None,
        "age_median_s": percentile(ages, 0.5),
        "age_p95_s": percentile(ages, 0.95),
        "steps": len(fetched),
        "failures": sum(failures[k] for k in FAILURES),
        "counters": dict(failures),
    }


def dropout_stats(run: dict[str, Any], j: int) -> dict[str, Any]:
    """What the cut did: the others meanwhile, the cut host meanwhile, and its groups after the restore."""
    ev, k = run["events"], run["dropout_host"]
    cut, restore, end = ev["cut"], ev["restore"], ev["end"]
    others = {r["host"] for r in run["results"] if r["role"] == "publisher" and r["host"] != k}
    mine = next(r for r in run["results"] if r["host"] == k)
    observers = [r for r in run["results"] if r["role"] == "observer"]
    created = dict(mine["published"])
    # first sightings (observer clock) of the cut host's groups after the restore
    sightings = sorted(
        created[gid] + latency
        for o in observers
        for gid, latency in o["latencies"].items()
        if gid in created and created[gid] + latency >= restore
    )
    after_restore = sorted(
        created[gid] + latency
        for o in observers
        for gid, latency in o["latencies"].items()
        if gid in created and created[gid] >= restore
    )
    own_fill_back = next((t - restore for t, got in mine["steps"] if t >= restore and got > 0), None)
    return {
        "host": k,
        "cut_seconds": restore - cut,
        "others_during_cut": window_stats(run, cut, restore, j, others),
        "others_before_cut": window_stats(run, ev["wan + dropout"] + 10, cut, j, others),
        "cut_host_during_cut": window_stats(run, cut, restore, j, {k}),
        "cut_host_after_restore": window_stats(run, restore, end - 20, j, {k}),
        "first_sighting_after_restore_s": sightings[0] - restore if sightings else None,
        "first_new_group_seen_after_restore_s": after_restore[0] - restore if after_restore else None,
        "cut_host_fetches_again_after_s": own_fill_back,
        "cut_host_counters": failures_between(mine, cut, end),
    }


def switch_delta(sw: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    """The switch's forwarding rate, CPU share, lateness and drops between its stats ``sw[a]`` and ``sw[b]``."""

    def total(at: str, key: str) -> float:
        return sum(p.get(key, 0) for p in sw[at]["ports"].values())

    seconds = sw[b]["uptime_s"] - sw[a]["uptime_s"]
    late = {k: sw[b]["lateness"][k] - sw[a]["lateness"][k] for k in ("n", "sum_ms", "over_5ms", "over_20ms")}
    return {
        "frames_per_s": (total(b, "tx") - total(a, "tx")) / seconds,
        "cpu_share": (sw[b]["cpu_s"] - sw[a]["cpu_s"]) / seconds,
        "mean_lateness_ms": late["sum_ms"] / late["n"] if late["n"] else None,
        "share_late_over_5ms": late["over_5ms"] / late["n"] if late["n"] else None,
        "share_late_over_20ms": late["over_20ms"] / late["n"] if late["n"] else None,
        **{k: total(b, k) - total(a, k) for k in ("tx", "lost", "queue_drops", "down_drops", "kernel_drops")},
    }


def analyse(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Per-condition figures (groups created after ``--settle`` s of each phase) and the dropout figures."""
    ev, s = run["events"], args.settle
    conditions = {
        "wan": window_stats(run, ev["wan"] + s, ev["no delay"], args.j),
        "no delay": window_stats(run, ev["no delay"] + s, ev["wan + dropout"], args.j),
        "wan (before the cut)": window_stats(run, ev["wan + dropout"] + s, ev["cut"], args.j),
    }
    sw = run["switch"]

    ports = sw["end"]["ports"].values()
    return {
        "conditions": conditions,
        "dropout": dropout_stats(run, args.j),
        "switch_during": {
            "wan": switch_delta(sw, "wan", "no delay"),
            "no delay": switch_delta(sw, "no delay", "wan + dropout"),
            "wan + dropout": switch_delta(sw, "wan + dropout", "end"),
        },
        "switch_totals": {
            k: sum(p.get(k, 0) for p in ports)
            for k in ("rx", "tx", "lost", "queue_drops", "down_drops", "oversize", "send_errors", "kernel_drops")
        },
        "switch_lateness": sw["end"]["lateness"],
        "all_healthy": all(r["healthy"] for r in run["results"]),
    }


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """Run the swarm through its phases (or one worker, with ``--worker``), write the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 publishers, 1 observer, short phases")
    parser.add_argument("--hosts", type=int, default=6, help="publisher hosts (one peer each)")
    parser.add_argument("--observers", type=int, default=2, help="observer hosts (one peer each)")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between two steps of a publisher")
    parser.add_argument("--j", type=int, default=4, help="external groups fetched per step")
    parser.add_argument("--loss", type=float, default=0.01, help="loss per direction on every WAN link")
    parser.add_argument("--phase", type=float, default=120.0, help="seconds of the wan and no-delay phases")
    parser.add_argument("--before-cut", type=float, default=40.0, help="seconds of WAN before the cut")
    parser.add_argument("--cut", type=float, default=45.0, help="seconds the dropout host's link is cut")
    parser.add_argument("--after", type=float, default=90.0, help="seconds measured after the restore")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds of each phase left out of its figures")
    parser.add_argument("--seed", type=int, default=0, help="seed of the link draws and the switch's loss")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--no-write", action="store_true", help="print the report only")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--role", default="publisher", help=argparse.SUPPRESS)
    parser.add_argument("--host", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--address", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--initial-peer", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return None
    if args.quick:
        args.hosts, args.observers, args.phase, args.before_cut, args.cut, args.after = 3, 1, 40, 20, 20, 40
        args.settle = 10
    if shutil.which("ip") is None or os.geteuid() != 0:
        sys.exit("needs root and iproute2 (network namespaces)")
    record = run_record()  # at the start: the commit the measured code ran on
    workdir = Path(tempfile.mkdtemp(prefix="transport_wan-"))
    try:
        run = run_swarm(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    analysis = analyse(run, args)
    notes = [
        "- delivery: an observer peer (publishes nothing, fetch every 0.25 s) records its clock minus the group's "
        "created_at at first sighting (benchmarks/delivery.py); all hosts are namespaces of one machine, so one "
        "clock. Medians and p95 pool both observers; delivered share: groups published in the window that an "
        "observer saw by the end of the run, averaged over observers.",
        f"- windows: groups created (and publisher steps taken) from {args.settle:.0f} s after a phase began to its "
        "end; the first phase starts right after the peers joined. fill rate: groups fetch(J) returned / J per "
        "publisher step. failures: publish_failures + fetch_failures + publish_dropped + index_store_failures of "
        "the peers concerned (observers included) in the window.",
        "- One swarm goes through all phases (links changed at run time), so the no-delay phase starts with caches "
        "and routing tables built under WAN links.",
    ]
    report = {
        **record,
        "setup": f"{args.hosts} publisher hosts + {args.observers} observer host(s), one DHTTransport each in its own "
        f"network namespace behind its own switch link; every {args.interval:.0f} s each publisher publishes 4 "
        f"groups x 8 completions x 1500 chars and fetches J={args.j}; phases: wan {args.phase:.0f} s, no delay "
        f"{args.phase:.0f} s, wan + dropout {args.before_cut + args.cut + args.after:.0f} s (cut {args.cut:.0f} s "
        f"after {args.before_cut:.0f} s)",
        "settings": {k: v for k, v in vars(args).items() if k not in ("results_dir", "no_write")},
        # the per-worker counter snapshots served the analysis; the rest of the raw run is kept
        "run": {**run, "results": [{k: v for k, v in r.items() if k != "snapshots"} for r in run["results"]]},
        "analysis": analysis,
        "notes": notes,
    }
    if not args.no_write:
        write_outputs(report, args.results_dir)
    print(json.dumps(analysis["conditions"], indent=1))
    print(json.dumps({k: v for k, v in analysis["dropout"].items() if not isinstance(v, dict)}, indent=1))
    return report


if __name__ == "__main__":
    main()
