"""Faults and attacks, measured: hostile peers, kill -9 crashes, and a long soak of a local swarm.

Parts (``--parts``, default all three):

- ``hostile``: ``--rounds`` times, an honest SAPOTrainer (tiny model) on a real loopback DHT beside an honest
  friend, a lying peer and a raw hostile DHT node (``testbed/hostile_peer.py``: random bytes, wrong schemas,
  oversized records, forged and unsigned subkeys, never-expiring records, a burst of ``--burst`` records,
  groups with a wrong answer, a question that does not match its provenance, an unknown task, empty, huge,
  non-text and too many completions). Counts the bad inputs tried by kind, the rejections by reason, the
  poisoned rows trained on (target 0) and the crashes (target 0).
- ``crashes``: one sapo-node (tiny model, a checkpoint every step) killed with SIGKILL ``--kills`` times, at
  random moments and in the middle of checkpoint writes, and restarted each time. Counts the restarts that
  resumed from the newest complete checkpoint and the steps lost per fault.
- ``soak``: ``sapo-node local-swarm`` with 3 nodes for ``--soak-minutes`` (default 30): tiny-model nodes, or with
  ``--soak-model default`` nodes on every default of ``sapo-node`` (SmolLM2-135M, held-out evaluation, checkpoints
  every 20 steps), what a community member runs. Samples every node's and its p2pd's RSS, the DHT items each node
  stores and the step rate; reports memory growth per hour and the step rate of the first and last fifth.

Usage:
    python -m benchmarks.reliability                       # all parts (about 45 minutes on 2 cores)
    python -m benchmarks.reliability --parts hostile,crashes --rounds 2 --kills 4
    python -m benchmarks.reliability --parts soak --soak-minutes 30
    python -m benchmarks.reliability --parts soak --soak-minutes 120 --soak-model default \
        --output-dir benchmarks/results/soak_default      # issue 24's two hours on the default model

Writes ``reliability.json`` and ``reliability.md`` into ``--output-dir`` (default benchmarks/results); a part
already there with the same settings is kept (``--force`` reruns it). Every process and DHT peer it starts
is stopped, by PID, also on failure.
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
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS,
    pyplot,
    quarter_growth_per_hour,
    rss_mb,
    run_record,
    stop_processes,
    utc_now,
    write_report,
)

PARTS = ("hostile", "crashes", "soak")
SOAK_RECORD_TTL = 600.0  # DHTTransportConfig.record_ttl of the soak's nodes (the default)
TINY_NODE = [
    "--num_local", "1", "--num_external", "1", "--num_generations", "2", "--per_device_train_batch_size", "4",
    "--max_completion_length", "8", "--dataset_size", "64", "--tasks", "basic_arithmetic",
    "--sampling_strategy", "uniform",
]  # fmt: skip


# ------------------------------------------------------------------------------------------------
# hostile peers


@contextlib.contextmanager
def dht_peer_factory() -> Iterator[Any]:
    """``make(**config)`` -> DHTTransport on 127.0.0.1; every peer made is closed (and its p2pd killed) at exit."""
    from swarm.daemon import pid_alive
    from swarm.dht import DHTTransport

    made: list[Any] = []

    def make(**config: Any) -> Any:
        fast = {"poll_interval": 0.2, "index_refresh_interval": 1.0, "index_min_interval": 0.2}
        peer = DHTTransport(**{**fast, **config})
        made.append(peer)
        return peer

    try:
        yield make
    finally:
        for peer in made:
            with contextlib.suppress(Exception):
                peer.close()
            if peer.p2pd_pid is not None and pid_alive(peer.p2pd_pid):
                os.kill(peer.p2pd_pid, signal.SIGKILL)


def run_hostile(rounds: int, burst_size: int, workdir: Path) -> dict[str, Any]:
    """``rounds`` hostile rounds; bad inputs by kind, rejections by reason, poisoned rows trained, crashes."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from sapo.models import default_model_path, prepare_tokenizer
    from testbed.hostile_peer import hostile_round, poisoned_rows_trained

    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(default_model_path()))
    tried: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    out: dict[str, Any] = {"rounds": [], "crashes": 0, "poisoned_rows_trained": 0}
    for index in tqdm(range(rounds), desc="hostile rounds", unit="round"):
        try:
            with dht_peer_factory() as make:
                outcome = hostile_round(workdir / f"hostile-{index}", tokenizer, make, burst_size=burst_size)
        except Exception as e:  # an honest node that raises has crashed: count it, keep measuring
            out["crashes"] += 1
            out["rounds"].append({"error": f"{type(e).__name__}: {e}"})
            continue
        trainer = outcome["trainer"]
        logged = [row for row in trainer.state.log_history if "train_runtime" not in row][-1]
        tried.update(outcome["expected"].keys())
        tried["burst_records"] += burst_size
        for name, value in logged.items():
            if name.startswith(("swarm/rejected/", "sapo/total/dropped/")):
                rejected[name] += int(value)
        missed = [
            kind for kind, counter in outcome["expected"].items()
            if counter != "trained_with_own_truth" and logged.get(counter, 0) < 1
        ]  # fmt: skip
        poisoned = poisoned_rows_trained(outcome["trained"])
        out["poisoned_rows_trained"] += poisoned
        out["rounds"].append(
            {
                "steps": trainer.state.global_step,
                "kinds_not_counted": missed,
                "poisoned_rows_trained": poisoned,
                "burst_accepted": outcome["burst_accepted"],
                "burst_seconds": round(outcome["burst_seconds"], 2),
                "external_groups_trained": dict(trainer.taken_from),
            }
        )
    out["bad_inputs_tried_by_kind"] = {kind: n for kind, n in sorted(tried.items())}
    out["rejections_by_reason"] = dict(sorted(rejected.items()))
    return out


# ------------------------------------------------------------------------------------------------
# crashes


def _metrics_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            steps.append(int(json.loads(line)["step"]))
    return steps


def _wait(condition: Any, timeout: float, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise RuntimeError(f"node exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError("node made no progress")
        time.sleep(0.002)


def run_crashes(kills: int, model_dir: Path, workdir: Path, seed: int = 0) -> dict[str, Any]:
    """Kill one node ``kills`` times (every other kill mid-checkpoint), restart it; resume and loss figures."""
    from tqdm import tqdm

    from sapo.checkpoints import checkpoints, latest_complete_checkpoint

    out_dir = workdir / "crash-node"
    rng = random.Random(seed)
    command = [
        sys.executable,
        "-m",
        "sapo.node.cli",
        "--model",
        str(model_dir),
        "--output_dir",
        str(out_dir),
        *TINY_NODE,
    ]
    faults = []
    expected = None
    faults_exit = None
    for index in tqdm(range(kills + 1), desc="kill -9 and restart", unit="life"):
        last = kills == index
        log = workdir / f"crash-life-{index}.log"
        steps_before = max(_metrics_steps(out_dir), default=0)
        max_steps = steps_before + 2 if last else 100000
        node = subprocess.Popen(
            [*command, "--max_steps", str(max_steps), "--save_steps", "1"],
            stdout=subprocess.DEVNULL, stderr=open(log, "w"),
        )  # fmt: skip
        try:
            if faults and expected is not None:
                _wait(lambda log=log: "resuming from" in log.read_text(), 300, node)
                faults[-1]["resumed_from_newest_complete"] = f"resuming from {expected}" in log.read_text()
            elif faults:  # killed before its first complete checkpoint: it must start over, from nothing
                _wait(lambda: max(_metrics_steps(out_dir), default=0) >= 1, 300, node)
                faults[-1]["resumed_from_newest_complete"] = "resuming from" not in log.read_text()
            if last:
                faults_exit = node.wait(timeout=600)
                break
            _wait(lambda steps_before=steps_before: max(_metrics_steps(out_dir), default=0) > steps_before, 300, node)
            moment = "mid_checkpoint" if index % 2 == 0 else "random"
            if moment == "mid_checkpoint":
                _wait(lambda: any(not done for _, _, done in checkpoints(out_dir)), 300, node)
            else:
                time.sleep(rng.uniform(0.0, 6.0))
            node.send_signal(signal.SIGKILL)
            node.wait(timeout=30)
        finally:
            if node.poll() is None:
                node.kill()
                node.wait(timeout=30)
        expected = latest_complete_checkpoint(out_dir)
        logged = max(_metrics_steps(out_dir), default=0)
        resumed_step = int(expected.name.split("-")[1]) if expected is not None else 0
        faults.append({"moment": moment, "last_logged_step": logged, "steps_lost": logged - resumed_step})
    steps = _metrics_steps(out_dir)
    return {
        "faults": faults,
        "faults_injected": len(faults),
        "resumed_from_newest_complete": sum(bool(f.get("resumed_from_newest_complete")) for f in faults),
        "steps_lost_per_fault": statistics.mean(f["steps_lost"] for f in faults) if faults else None,
        "final_exit_code": faults_exit,
        "steps_logged_twice": len(steps) - len(set(steps)),
    }


# ------------------------------------------------------------------------------------------------
# soak


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


# ------------------------------------------------------------------------------------------------
# outputs


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Reliability: faults and attacks", ""]
    for part, data in result["parts"].items():
        lines += [f"## {part}", "", f"Command: `{data['command']}`  ", f"Commit `{data['git_commit']}`, "
                  f"{data['date']}, {data['machine']}", ""]  # fmt: skip
        if part == "hostile":
            lines += [
                f"- rounds: {len(data['rounds'])}; crashes of the honest node: {data['crashes']} (target 0); "
                f"poisoned rows trained on: {data['poisoned_rows_trained']} (target 0)",
                f"- bad inputs tried, by kind: {json.dumps(data['bad_inputs_tried_by_kind'])}",
                f"- rejections by reason (honest node's metrics): {json.dumps(data['rejections_by_reason'])}",
                "- kinds not counted in some round: "
                + (", ".join(sorted({k for r in data["rounds"] for k in r.get("kinds_not_counted", [])})) or "none"),
            ]
        elif part == "crashes":
            lines += [
                f"- faults injected (kill -9): {data['faults_injected']}; restarts that resumed from the newest "
                f"complete checkpoint: {data['resumed_from_newest_complete']}",
                f"- steps lost per fault (mean): {data['steps_lost_per_fault']}; steps logged twice: "
                f"{data['steps_logged_twice']}; exit code of the last life: {data['final_exit_code']}",
            ]
        elif part == "soak":
            lines += ["Memory: medians of the 2nd and of the last quarter (the first is warm-up), growth per hour "
                      "between them, and the peak. DHT items: stored by this node's DHT, against every record it "
                      "published: bounded by expiry, they follow the publication rate, not the total.", "",
                      "| node | node MB q2 -> q4 | node MB/h | node MB max | p2pd MB q2 -> q4 | p2pd MB/h "
                      "| DHT items q2 -> q4 (max) | records published | steps/min first fifth | last fifth "
                      "| steps | groups received | held-out first -> last (steps) |",
                      "|---" * 13 + "|"]  # fmt: skip
            for name, s in data["summary"].items():
                lines.append(
                    f"| {name} | {_f(s['node_mb_median_q2'], '.0f')} -> {_f(s['node_mb_median_q4'], '.0f')} "
                    f"| {_f(s['node_mb_growth_per_hour'])} | {_f(s['node_mb_max'], '.0f')} "
                    f"| {_f(s['p2pd_mb_median_q2'])} -> {_f(s['p2pd_mb_median_q4'])} "
                    f"| {_f(s['p2pd_mb_growth_per_hour'])} "
                    f"| {_f(s['dht_stored_items_median_q2'], '.0f')} -> {_f(s['dht_stored_items_median_q4'], '.0f')} "
                    f"({_f(s['dht_stored_items_max'], '.0f')}) | {_f(s['published_records_total'], '.0f')} "
                    f"| {_f(s['steps_per_minute_first_fifth'])} | {_f(s['steps_per_minute_last_fifth'])} "
                    f"| {_f(s.get('steps_last'), '.0f')} | {_f(s.get('received_groups_total'), '.0f')} "
                    f"| {_held_out_cell(s)} |"
                )
            lines += _soak_storage_and_windows(data)
        lines.append("")
    return "\n".join(lines)


def _soak_storage_and_windows(data: dict[str, Any]) -> list[str]:
    lines = []
    storage = data.get("storage")
    if storage and storage["items_per_record_within_ttl_median"] is not None:
        low, high = storage["items_per_record_within_ttl_range"]
        median = storage["items_per_record_within_ttl_median"]
        lines += ["", f"DHT storage against expiry: items stored per record the swarm published in the last "
                  f"{storage['ttl_seconds']:.0f} s (the record ttl): median {median:.3f}, "
                  f"range {low:.3f}-{high:.3f}, while {storage['records_published_total']:.0f} records were published "
                  "in all: storage follows what has not expired yet, not the total."]  # fmt: skip
    if data.get("windows"):
        names = [k for k in data["windows"][0] if k.startswith("node-")]
        lines += ["", "Per 5 minutes, RSS median / peak (MB) of each node, and DHT items at the window's end:", "",
                  "| minute | " + " | ".join(names) + " | DHT items |", "|---" * (len(names) + 2) + "|"]  # fmt: skip
        for row in data["windows"]:
            cells = [f"{_f((row[n] or {}).get('median_mb'), '.0f')} / {_f((row[n] or {}).get('max_mb'), '.0f')}"
                     for n in names]  # fmt: skip
            lines.append(f"| {row['minute']:.0f} | " + " | ".join(cells) + f" | {_f(row['dht_stored_items'], '.0f')} |")
    if data.get("plot"):
        lines += ["", f"![soak]({data['plot']})"]
    return lines


def _held_out_cell(summary: dict[str, Any]) -> str:
    first, last = summary.get("held_out_first"), summary.get("held_out_last")
    if not first:
        return "-"
    return f"{first[1]:.3f} -> {last[1]:.3f} (steps {first[0]} -> {last[0]})"


def _f(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {PARTS}")
    parser.add_argument("--rounds", type=int, default=3, help="hostile rounds")
    parser.add_argument("--burst", type=int, default=2000, help="records in the hostile node's burst")
    parser.add_argument("--kills", type=int, default=6, help="kill -9 faults injected into one node")
    parser.add_argument("--soak-minutes", type=float, default=30.0)
    parser.add_argument(
        "--soak-model", choices=("tiny", "default"), default="tiny",
        help="soak nodes: tiny models, or every default of sapo-node (the default model)",
    )  # fmt: skip
    parser.add_argument("--output-dir", default=str(RESULTS))
    parser.add_argument("--force", action="store_true", help="rerun parts already saved with the same settings")
    parser.add_argument(
        "--render", action="store_true", help="run nothing: rebuild the figures, markdown and plot from the saved JSON"
    )
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {PARTS}")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "reliability.json"
    result = json.loads(path.read_text()) if path.exists() else {"parts": {}}
    settings = {
        "hostile": {"rounds": args.rounds, "burst": args.burst},
        "crashes": {"kills": args.kills},
        "soak": {"minutes": args.soak_minutes, **({"model": "default"} if args.soak_model == "default" else {})},
    }
    if args.render:
        return render(result, out_dir)
    from sapo.models import save_tiny_model

    command = "python -m benchmarks.reliability " + " ".join(sys.argv[1:] if argv is None else argv)
    record = run_record(command)  # at the start: the code every part runs, even if the tree changes while they run
    with tempfile.TemporaryDirectory(prefix="sapo-reliability-") as tmp:
        workdir = Path(tmp)
        model_dir = save_tiny_model(workdir / "tiny-model")
        for part in args.parts:
            saved = result["parts"].get(part)
            if saved and saved.get("settings") == settings[part] and not args.force:
                print(f"reliability: {part}: kept from {saved['date']} (--force reruns it)")
                continue
            if part == "hostile":
                data = run_hostile(args.rounds, args.burst, workdir)
            elif part == "crashes":
                data = run_crashes(args.kills, model_dir, workdir)
            else:
                data = run_soak(args.soak_minutes, model_dir, workdir, model=args.soak_model)
            data.update(record, settings=settings[part], date=utc_now())
            result["parts"][part] = data
            render(result, out_dir)  # each part saved as it ends
    return result


def render(result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Write reliability.json, the soak's figures and plot, and reliability.md; print the markdown."""
    soak = result["parts"].get("soak")
    if soak and soak.get("samples"):
        names = sorted(k for k in soak["samples"][-1] if k.startswith("node-"))
        soak.update({k: v for k, v in soak_result(soak["samples"], names).items() if k != "samples"})
        soak_plot(
            soak["samples"],
            names,
            SOAK_RECORD_TTL,
            out_dir / "reliability_soak.png",
            soak["settings"].get("model", "tiny"),
        )
        soak["plot"] = "reliability_soak.png"
    text = markdown(result)
    write_report(out_dir, "reliability", result, [text])
    print(text)
    return result


if __name__ == "__main__":
    main()
