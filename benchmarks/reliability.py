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
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS,
    run_record,
    utc_now,
    write_report,
)
from benchmarks.soak import SOAK_RECORD_TTL, run_soak, soak_plot, soak_result, tiny_node_command

PARTS = ("hostile", "crashes", "soak")
RELIABILITY_PEERS = {"poll_interval": 0.2, "index_refresh_interval": 1.0, "index_min_interval": 0.2}
"""The DHTTransport settings of the hostile rounds' peers (faster polls and index reads than a node's)."""


# ------------------------------------------------------------------------------------------------
# hostile peers


def run_hostile(rounds: int, burst_size: int, workdir: Path) -> dict[str, Any]:
    """``rounds`` hostile rounds; bad inputs by kind, rejections by reason, poisoned rows trained, crashes."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from sapo.models import default_model_path, prepare_tokenizer
    from testbed.dht_peers import dht_peer_factory
    from testbed.hostile_peer import hostile_round, poisoned_rows_trained

    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(default_model_path()))
    tried: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    out: dict[str, Any] = {"rounds": [], "crashes": 0, "poisoned_rows_trained": 0}
    for index in tqdm(range(rounds), desc="hostile rounds", unit="round"):
        try:
            with dht_peer_factory(RELIABILITY_PEERS) as make:
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
    command = tiny_node_command(model_dir, out_dir)
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
