"""The soak of a local swarm: three nodes for hours, their memory, DHT storage and step rate sampled over time."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import pyplot, quarter_growth_per_hour, rss_mb, stop_processes

SOAK_RECORD_TTL = 600.0  # DHTTransportConfig.record_ttl of the soak's nodes (the default)
TINY_NODE = [
    "--num_local", "1", "--num_external", "1", "--num_generations", "2", "--per_device_train_batch_size", "4",
    "--max_completion_length", "8", "--dataset_size", "64", "--tasks", "basic_arithmetic",
    "--sampling_strategy", "uniform",
]  # fmt: skip
"""A tiny node's settings (2 groups of 2 completions per step, completions of 8 tokens): small enough for 2 cores."""


def tiny_node_command(model_dir: str | Path, output_dir: str | Path, *extra: str) -> list[str]:
    """The command line of one sapo-node on ``model_dir`` writing into ``output_dir`` at :data:`TINY_NODE`'s settings,
    ``extra`` after them."""
    return [sys.executable, "-m", "sapo.node.cli", "--model", str(model_dir), "--output_dir", str(output_dir),
            *TINY_NODE, *extra]  # fmt: skip


def _node_pids(run_dir: Path, peers: int) -> dict[str, tuple[int | None, int | None]]:
    """node name -> (node pid, p2pd pid): the p2pd pid from the state file each node writes, the node's as
    its parent."""
    from swarm.daemon import parent_pid

    out = {}
    for i in range(peers):
        node_dir = run_dir / f"node-{i}"
        state = node_dir / "p2pd-state.json"
        p2pd = json.loads(state.read_text()).get("p2pd_pid") if state.exists() else None
        out[f"node-{i}"] = (parent_pid(p2pd) if p2pd is not None else None, p2pd)
    return out


def run_soak(
    minutes: float, model_dir: Path, workdir: Path, interval: float = 10.0, model: str = "tiny"
) -> dict[str, Any]:
    """A 3-node local swarm for ``minutes`` (``model``: "tiny", the nodes of ``model_dir`` at TINY_NODE's settings, or
    "default", every default of sapo-node); memory, DHT storage and step rate over time."""
    from tqdm import tqdm

    from sapo.node.local_swarm import latest_metrics

    peers = 3
    run_dir = workdir / "soak"
    command = [
        sys.executable, "-m", "sapo.node.cli", "local-swarm", "--peers", str(peers), "--run-dir", str(run_dir),
        "--status-interval", "60", "--max_steps", "1000000", "--save_total_limit", "2",
        *(["--model", str(model_dir), *TINY_NODE, "--save_steps", "200"] if model == "tiny" else
          ["--model", "default", "--save_steps", "20"]),
    ]  # fmt: skip
    swarm = subprocess.Popen(command, stdout=open(workdir / "soak.log", "w"), stderr=subprocess.STDOUT)
    samples = []
    started = time.monotonic()
    try:
        with tqdm(total=int(minutes * 60), desc="soak", unit="s") as bar:
            while time.monotonic() - started < minutes * 60:
                if swarm.poll() is not None:
                    raise RuntimeError(f"local-swarm exited with {swarm.returncode}; see {workdir / 'soak.log'}")
                sample: dict[str, Any] = {"t": round(time.monotonic() - started, 1)}
                for name, (node_pid, p2pd_pid) in _node_pids(run_dir, peers).items():
                    row, held_out = latest_metrics(run_dir / name / "metrics.jsonl")
                    sample[name] = {
                        "node_mb": rss_mb(node_pid) if node_pid else None,
                        "p2pd_mb": rss_mb(p2pd_pid) if p2pd_pid else None,
                        "step": row.get("step"),
                        "dht_stored_items": row.get("swarm/gauge/dht_stored_items"),
                        "seen_refs": row.get("swarm/gauge/seen_refs"),
                        "received_groups": row.get("swarm/received_groups"),
                        "published_records": row.get("swarm/published_records"),
                        "held_out": held_out.get("eval/pass@1"),
                        "held_out_step": held_out.get("step"),
                    }
                samples.append(sample)
                time.sleep(interval)
                bar.update(int(time.monotonic() - started) - bar.n)
    finally:
        stop_processes([swarm], grace=300)  # SIGTERM: the nodes checkpoint and leave
    return soak_result(samples, [f"node-{i}" for i in range(peers)])


def soak_result(samples: list[dict[str, Any]], names: list[str], ttl: float = SOAK_RECORD_TTL) -> dict[str, Any]:
    """Every figure of the soak part, from its samples."""
    return {
        "samples": samples,
        "summary": soak_summary(samples, names),
        "storage": storage_vs_expiry(samples, names, ttl),
        "windows": windows(samples, names),
    }


def soak_summary(samples: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per node: memory (2nd vs last quarter, growth per hour, peak), DHT items (peak, last quarter, against the
    records published), and the step rate of the first vs the last fifth."""
    out = {}
    for name in names:
        rows = [(s["t"], s[name]) for s in samples if isinstance(s.get(name), dict)]
        fifth = max(2, len(rows) // 5)

        def rate(part: list[tuple[float, dict]]) -> float | None:
            steps = [(t, r["step"]) for t, r in part if r.get("step") is not None]
            if len(steps) < 2 or steps[-1][0] == steps[0][0]:
                return None
            return 60 * (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])

        def series(key: str, rows: list[tuple[float, dict]] = rows) -> list[tuple[float, float]]:
            return [(t, r[key]) for t, r in rows if r.get(key) is not None]

        node_q2, node_q4, node_growth = quarter_growth_per_hour(series("node_mb"))
        p2pd_q2, p2pd_q4, p2pd_growth = quarter_growth_per_hour(series("p2pd_mb"))
        items_q2, items_q4, _ = quarter_growth_per_hour(series("dht_stored_items"))
        published = series("published_records")
        received = series("received_groups")
        evaluations = held_out_series(rows)
        out[name] = {
            "node_mb_median_q2": node_q2,
            "node_mb_median_q4": node_q4,
            "node_mb_growth_per_hour": node_growth,
            "node_mb_max": max((v for _, v in series("node_mb")), default=None),
            "p2pd_mb_median_q2": p2pd_q2,
            "p2pd_mb_median_q4": p2pd_q4,
            "p2pd_mb_growth_per_hour": p2pd_growth,
            "p2pd_mb_max": max((v for _, v in series("p2pd_mb")), default=None),
            "dht_stored_items_max": max((v for _, v in series("dht_stored_items")), default=None),
            "dht_stored_items_median_q2": items_q2,
            "dht_stored_items_median_q4": items_q4,
            "published_records_total": published[-1][1] if published else None,
            "steps_per_minute_first_fifth": rate(rows[:fifth]),
            "steps_per_minute_last_fifth": rate(rows[-fifth:]),
            "steps_last": max((r["step"] for _, r in rows if r.get("step") is not None), default=None),
            "received_groups_total": received[-1][1] if received else None,
            "held_out_first": list(evaluations[0]) if evaluations else None,
            "held_out_last": list(evaluations[-1]) if evaluations else None,
            "held_out_evaluations": len(evaluations),
        }
    return out


def held_out_series(rows: list[tuple[float, dict[str, Any]]]) -> list[tuple[int, float]]:
    """(step, held-out pass@1) of each distinct evaluation a node's samples saw, in order."""
    out: list[tuple[int, float]] = []
    for _, r in rows:
        if r.get("held_out") is not None and (not out or r.get("held_out_step") != out[-1][0]):
            out.append((r.get("held_out_step"), r["held_out"]))
    return out


def publications(samples: list[dict[str, Any]], names: list[str], ttl: float) -> list[tuple[float, float, float]]:
    """(seconds, records the swarm published in all, records it published in the last ``ttl`` seconds), for
    every sample where all ``names`` reported."""

    def published(sample: dict[str, Any]) -> float:
        return sum((sample.get(n) or {}).get("published_records") or 0 for n in names)

    out = []
    for sample in samples:
        if all(isinstance(sample.get(n), dict) for n in names):
            earlier = next(s for s in samples if s["t"] >= sample["t"] - ttl)
            out.append((sample["t"], published(sample), published(sample) - published(earlier)))
    return out


def storage_vs_expiry(samples: list[dict[str, Any]], names: list[str], ttl: float) -> dict[str, Any]:
    """DHT items stored against the records the swarm published within the last ``ttl`` seconds: a storage
    bounded by expiry holds about those (ratio ~1), however many were published in all."""
    items = {s["t"]: statistics.mean(s[n]["dht_stored_items"] or 0 for n in names) for s in samples
             if all(isinstance(s.get(n), dict) for n in names)}  # fmt: skip
    series = [(t, total, within) for t, total, within in publications(samples, names, ttl) if t >= ttl]
    ratios = [items[t] / within for t, _, within in series if within > 0]
    return {
        "ttl_seconds": ttl,
        "items_per_record_within_ttl_median": statistics.median(ratios) if ratios else None,
        "items_per_record_within_ttl_range": [min(ratios), max(ratios)] if ratios else None,
        "records_published_total": series[-1][1] if series else None,
    }


def windows(samples: list[dict[str, Any]], names: list[str], minutes: float = 5.0) -> list[dict[str, Any]]:
    """Per window of ``minutes``: each node's median and peak RSS (MB) and the DHT items at its end."""
    out = []
    t_end = samples[-1]["t"] if samples else 0.0
    start = 0.0
    while start < t_end:
        part = [s for s in samples if start <= s["t"] < start + 60 * minutes]
        row: dict[str, Any] = {"minute": start / 60}
        for n in names:
            rss = [s[n]["node_mb"] for s in part if isinstance(s.get(n), dict) and s[n].get("node_mb")]
            row[n] = {"median_mb": statistics.median(rss), "max_mb": max(rss)} if rss else None
        row["dht_stored_items"] = next(
            (s[names[0]]["dht_stored_items"] for s in reversed(part) if isinstance(s.get(names[0]), dict)), None
        )
        out.append(row)
        start += 60 * minutes
    return out


def soak_plot(samples: list[dict[str, Any]], names: list[str], ttl: float, path: Path, model: str = "tiny") -> None:
    """Three panels over time: RSS of each node and its p2pd; DHT items vs records published within the ttl; each
    node's held-out pass@1 at its evaluations."""
    plt = pyplot()
    fig, (mem, dht, held) = plt.subplots(3, 1, figsize=(9, 9.5), sharex=True)
    for n in names:
        rows = [(s["t"] / 60, s[n]) for s in samples if isinstance(s.get(n), dict)]
        line = mem.plot([t for t, r in rows], [r["node_mb"] for _, r in rows], lw=0.8, label=f"{n} node")[0]
        mem.plot([t for t, r in rows], [r["p2pd_mb"] for _, r in rows], lw=0.8, ls="--", color=line.get_color(),
                 label=f"{n} p2pd")  # fmt: skip
    mem.set_ylabel("RSS (MB)")
    mem.legend(ncol=3, fontsize=8)
    nodes = "3 tiny-model nodes" if model == "tiny" else "3 nodes on sapo-node's defaults (the default model)"
    mem.set_title(f"Soak: {nodes} in one local swarm")
    stored = [(s["t"] / 60, s[names[0]]["dht_stored_items"]) for s in samples if isinstance(s.get(names[0]), dict)]
    dht.plot([t for t, _ in stored], [v for _, v in stored], label=f"DHT items stored ({names[0]})")
    series = publications(samples, names, ttl)
    within = [(t / 60, w) for t, _, w in series]
    total = [(t / 60, n) for t, n, _ in series]
    dht.plot(
        [t for t, _ in within], [v for _, v in within], ls="--", label=f"records published in the last {ttl:.0f} s"
    )
    dht.plot([t for t, _ in total], [v for _, v in total], ls=":", label="records published in all")
    dht.set_ylabel("records")
    dht.legend(fontsize=8)
    for n in names:
        first_seen: dict[Any, float] = {}
        for s in samples:
            row = s.get(n)
            if isinstance(row, dict) and row.get("held_out") is not None:
                first_seen.setdefault(row.get("held_out_step"), (s["t"] / 60, row["held_out"]))
        points = list(first_seen.values())
        held.plot([t for t, _ in points], [v for _, v in points], marker="o", ms=3, lw=0.8, label=n)
    held.set_xlabel("minutes")
    held.set_ylabel("held-out pass@1")
    if any(held.get_lines()):
        held.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
