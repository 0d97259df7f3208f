"""Per-peer transport cost at 1,000 and 10,000 peers, projected from the measured swarm_transport results.

What it does: takes the per-peer, per-step costs that benchmarks/swarm_transport.py measured on real p2pd daemons
(network bytes between peers and CPU seconds, Python + p2pd) for the N this machine holds, fits two growth laws over
N >= 8 (below that every record is on every peer and lookups are local), and evaluates them at 1,000 and 10,000:

- logarithmic, ``a + b log2 N``: what a Kademlia DHT should cost when every per-step operation (one record store on
  ``num_replicas`` nodes, bounded index reads, J record lookups) takes O(log N) routing hops;
- power, ``c N^k``: what the measurement itself says when its growth is faster than that (e.g. an overloaded
  machine's retries, or copies a lookup leaves behind).

The two bracket the projection: if the power law fits the measurements better, the design (or the machine) is not
yet at its logarithmic cost, and the report says so. Also listed: the index stores per publication and index bytes
a reader pulls per step at N up to 2048 from benchmarks/transport_simulation.py (the reading side, no network).

    python -m benchmarks.transport_projection

Reads benchmarks/results/swarm_transport.json and transport_simulation.json; writes
benchmarks/results/transport_projection.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, run_record, write_report

TARGETS = (1000, 10000)
COSTS = {
    "network KB per peer-step": lambda r: r["tcp_bytes_per_peer_step"] / 1000,
    "network / payload": lambda r: r["network_to_payload"],
    "CPU s per peer-step": lambda r: r["python_cpu_seconds_per_peer_step"] + r["p2pd_cpu_seconds_per_peer_step"],
}
"""What is projected, read from one swarm_transport run (one N)."""


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Intercept, slope and root-mean-square residual of the straight line through ``(xs, ys)``."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    intercept = my - slope * mx
    rms = math.sqrt(sum((intercept + slope * x - y) ** 2 for x, y in zip(xs, ys, strict=True)) / n)
    return intercept, slope, rms


def fit(sizes: Sequence[int], values: Sequence[float]) -> dict[str, Any]:
    """Both growth laws fitted to ``values`` at ``sizes``, their relative misfit, and their values at TARGETS."""
    logs = [math.log2(n) for n in sizes]
    a, b, _ = least_squares(logs, values)
    log_c, k, _ = least_squares(logs, [math.log2(v) for v in values])

    def relative_rms(predict: Any) -> float:
        return math.sqrt(sum((predict(n) / v - 1) ** 2 for n, v in zip(sizes, values, strict=True)) / len(sizes))

    logarithmic = lambda n: a + b * math.log2(n)  # noqa: E731
    power = lambda n: 2**log_c * n**k  # noqa: E731
    return {
        "logarithmic": {
            "a": a,
            "b": b,
            "misfit": relative_rms(logarithmic),
            **{str(t): logarithmic(t) for t in TARGETS},
        },
        "power": {"c": 2**log_c, "k": k, "misfit": relative_rms(power), **{str(t): power(t) for t in TARGETS}},
    }


def project(transport: dict[str, Any], min_size: int = 8) -> dict[str, Any]:
    """Fits of every cost over the runs with at least ``min_size`` peers."""
    runs = [r for r in transport["runs"] if r.get("peers", 0) >= min_size and "tcp_bytes_per_peer_step" in r]
    if len(runs) < 2:
        raise SystemExit(f"transport_projection: need runs at 2 or more N >= {min_size}; got {len(runs)}")
    sizes = [r["peers"] for r in runs]
    return {
        "sizes": sizes,
        "measured": {name: [read(r) for r in runs] for name, read in COSTS.items()},
        "fits": {name: fit(sizes, [read(r) for r in runs]) for name, read in COSTS.items()},
    }


def markdown(report: dict[str, Any]) -> list[str]:
    """The report's page."""
    p = report["projection"]
    lines = [
        "# Per-peer transport cost projected to 1,000 and 10,000 peers",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{report['git_commit']}`, {report['date']}  ",
        f"From: benchmarks/results/swarm_transport.json (commit `{report['transport_commit']}`), N = "
        f"{', '.join(map(str, p['sizes']))}; transport_simulation.json (commit `{report['simulation_commit']}`).",
        "",
        "| cost | "
        + " | ".join(f"N = {n} (measured)" for n in p["sizes"])
        + " | law | misfit | N = 1,000 | N = 10,000 |",
        "|---|" + "---|" * len(p["sizes"]) + "---|---|---|---|",
    ]
    for name, fits in p["fits"].items():
        measured = " | ".join(f"{v:.3g}" for v in p["measured"][name])
        for law, label in (("logarithmic", "a + b log2 N"), ("power", "c N^k")):
            f = fits[law]
            shape = f"b = {f['b']:.3g}" if law == "logarithmic" else f"k = {f['k']:.2f}"
            lines.append(
                f"| {name} | {measured} | {label} ({shape}) | {f['misfit']:.0%} | {f['1000']:.3g} | {f['10000']:.3g} |"
            )
    sim = report.get("simulation_rows", [])
    if sim:
        lines += [
            "",
            "Reading side at larger N (simulation, no network): index KB a reader pulls per step and index stores per "
            "publication.",
            "",
            "| N | index KB per step | index stores per publication | fill rate | largest sender's share |",
            "|---|---|---|---|---|",
            *(
                f"| {r['peers']} | {r['index_kb_per_step']:.2f} | {r['index_stores_per_publication']:.1f} | "
                f"{r['fill_rate']:.2f} | {r['largest_sender_share']:.2f} |"
                for r in sim
            ),
        ]
    lines += ["", *report["notes"]]
    return lines


def simulation_rows(simulation: dict[str, Any]) -> list[dict[str, Any]]:
    """The columns of transport_simulation.json this report repeats, per N (empty if its layout is unknown)."""
    rows = []
    for r in simulation.get("runs", simulation.get("results", [])):
        try:
            rows.append(
                {
                    "peers": r["peers"],
                    "index_kb_per_step": r["index_bytes_per_step"] / 1000,
                    "index_stores_per_publication": r["index_stores_per_publication"],
                    "fill_rate": r["fill_rate"],
                    "largest_sender_share": r["largest_sender_share"],
                }
            )
        except KeyError:
            return []
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Fit, project, write the report."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.transport_projection", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the inputs are and the report goes")
    parser.add_argument("--notes", type=Path, default=None, help="a file of Markdown lines appended to the report")
    args = parser.parse_args(argv)
    transport = json.loads((args.results_dir / "swarm_transport.json").read_text())
    simulation_path = args.results_dir / "transport_simulation.json"
    simulation = json.loads(simulation_path.read_text()) if simulation_path.exists() else {}
    report = {
        **run_record(),
        "transport_commit": transport.get("git_commit"),
        "simulation_commit": simulation.get("git_commit"),
        "projection": project(transport),
        "simulation_rows": simulation_rows(simulation),
        "notes": args.notes.read_text().splitlines() if args.notes else [],
    }
    write_report(args.results_dir, "transport_projection", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
