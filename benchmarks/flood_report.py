"""The flood benchmark's figures and page (:mod:`benchmarks.flood`): each condition over its rounds, issue 61's
targets, the markdown report."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from benchmarks.harness import record_lines

TARGETS = {"trained": 0.9, "step_time": 1.3, "loop_stall_s": 0.1, "rss_mb": 200.0}
"""Issue 61: honest groups trained under attack >= 90 % of clean, step time <= 1.3x clean, no loop stall over
100 ms, RSS within 200 MB of clean."""


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One condition's figures over its rounds: groups per step over every step, the median step time over all but
    each round's first, the longest loop stalls, the peak RSS, rejects and what the attacker sent summed."""
    steps = sum(len(r["steps"]) for r in rounds)
    durations = [row["seconds"] for r in rounds for row in r["steps"][1:]] or [r["steps"][0]["seconds"] for r in rounds]

    def total(key: str) -> Counter[str]:
        return sum((Counter(r[key]) for r in rounds), Counter())

    return {
        "steps": steps,
        "honest_published": sum(r["honest_published"] for r in rounds),
        "honest_reached_per_step": sum(r["steps"][-1]["honest_reached"] for r in rounds) / steps,
        "honest_trained_per_step": sum(r["steps"][-1]["honest_trained"] for r in rounds) / steps,
        "others_reached_per_step": sum(r["steps"][-1].get("others_reached", 0) for r in rounds) / steps,
        "step_time_median_s": statistics.median(durations),
        "step_thread_cpu_median_s": statistics.median(
            [row["thread_cpu_s"] for r in rounds for row in r["steps"][1:]] or [0.0]
        ),
        "cpu_cores": {role: statistics.mean(r["cpu_cores"][role] for r in rounds) for role in rounds[0]["cpu_cores"]},
        "loop_stall_max_s": max(r["loop_stall"]["transport"]["longest_s"] for r in rounds),
        "loop_stalls_over_100ms": sum(r["loop_stall"]["transport"]["over_100ms"] for r in rounds),
        "reference_loop_stall_max_s": max(r["loop_stall"]["reference"]["longest_s"] for r in rounds),
        "reference_loop_stalls_over_100ms": sum(r["loop_stall"]["reference"]["over_100ms"] for r in rounds),
        "collector_pause_max_s": max(r["loop_stall"].get("collector", {}).get("longest_s", 0.0) for r in rounds),
        "load_average_max": max(r.get("load_average", 0.0) for r in rounds),
        "rss_peak_mb": max(row["rss_mb"] for r in rounds for row in r["steps"]),
        "rejects": dict(sorted(total("rejects").items())),
        "attacker_sent": dict(sorted(total("attacker_sent").items())),
        "rounds": rounds,
    }


def targets(clean: dict[str, Any], attack: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 61's targets (:data:`TARGETS`), each with its figure and whether it passed."""
    trained = (
        attack["honest_trained_per_step"] / clean["honest_trained_per_step"]
        if clean["honest_trained_per_step"]
        else None
    )
    step = attack["step_time_median_s"] / clean["step_time_median_s"]
    stall = attack["loop_stall_max_s"]
    rss = attack["rss_peak_mb"] - clean["rss_peak_mb"]
    return {
        "honest groups trained under attack / clean >= 0.9": {
            "value": trained, "pass": trained is not None and trained >= TARGETS["trained"]
        },
        "median step time under attack / clean <= 1.3": {"value": step, "pass": step <= TARGETS["step_time"]},
        "longest transport loop stall, attack, <= 0.1 s": {"value": stall, "pass": stall <= TARGETS["loop_stall_s"]},
        "peak RSS under attack - clean <= 200 MB": {"value": rss, "pass": rss <= TARGETS["rss_mb"]},
    }  # fmt: skip


def report_lines(data: dict[str, Any]) -> list[str]:
    """The markdown page of one run."""
    clean, attack = data["conditions"]["clean"], data["conditions"]["attack"]
    rows = [
        ("honest groups reaching the intake per step", "honest_reached_per_step", "{:.2f}"),
        ("honest groups trained per step", "honest_trained_per_step", "{:.2f}"),
        ("other senders' groups reaching the intake per step", "others_reached_per_step", "{:.2f}"),
        ("honest groups published", "honest_published", "{}"),
        ("median step time (s)", "step_time_median_s", "{:.2f}"),
        ("median CPU time of the training thread in a step (s)", "step_thread_cpu_median_s", "{:.2f}"),
        ("longest transport loop stall (ms)", "loop_stall_max_s", "{:.0f}", 1000),
        ("transport loop stalls over 100 ms", "loop_stalls_over_100ms", "{}"),
        (
            "longest stall of an idle reference loop in the same process (ms)",
            "reference_loop_stall_max_s",
            "{:.0f}",
            1000,
        ),
        ("reference loop stalls over 100 ms", "reference_loop_stalls_over_100ms", "{}"),
        ("longest garbage-collector pause in the process (ms)", "collector_pause_max_s", "{:.0f}", 1000),
        ("highest 1-minute load average at a round's end", "load_average_max", "{:.1f}"),
        ("peak RSS of the process (MB)", "rss_peak_mb", "{:.0f}"),
    ]
    lines = ["# Flood: a training node clean and under one hostile peer (issue 61)", "", *record_lines(data["run"]), ""]
    lines += [
        f"Beside this run: {data.get('beside') or 'not recorded'}. The step times and loop stalls carry the machine's "
        "load as well as the attack's (the load average is in the table). The conditions alternate (clean, attack, "
        "clean, ...; each round a fresh victim, honest peer and attacker) so that a change of load falls on both. The "
        "step time is the median over every step but each round's first (the trainer's start-up); loop stalls are "
        "watched from the end of the first step. The reference loop, an event loop with nothing on it in the victim's "
        "process, shows what the machine and the interpreter alone cost a loop (the OS scheduler, the GIL held by the "
        "training thread). The trainer leaves what is alive when it starts training out of the garbage collector's "
        "scans (sapo.collector), as a node does before it joins the swarm; the collector's longest pause is shown.",
        "",
        f"Settings: {data['settings']}",
        "",
        f"The victim's OpenMP threads: {data.get('openmp', 'not recorded')} (`python -m benchmarks.flood` sets them "
        "as `sapo-node` does, sapo.speed.threads: threads that wait for work sleep instead of spinning).",
        "",
        "| | clean | under attack |",
        "|---|---|---|",
    ]
    for label, key, fmt, *scale in rows:
        factor = scale[0] if scale else 1
        lines.append(f"| {label} | {fmt.format(clean[key] * factor)} | {fmt.format(attack[key] * factor)} |")
    lines += ["", "## Who used the cores", "",
              "CPU seconds a second (1.0 = one core of the 2) over the measured steps, by process, mean of the rounds: "
              "what the victim's step competes with. The hostile peer would be another machine in a real swarm; here "
              "it shares the victim's cores.", "", "| processes | clean | under attack |", "|---|---|---|"]  # fmt: skip
    for role in clean["cpu_cores"]:  # every condition has the same roles (the hostile peer's at 0 when clean)
        lines.append(f"| {role} | {clean['cpu_cores'][role]:.2f} | {attack['cpu_cores'][role]:.2f} |")
    lines += ["", "## Targets", "", "| target | figure | |", "|---|---|---|"]
    for name, target in data["targets"].items():
        value = "n/a" if target["value"] is None else f"{target['value']:.3g}"
        lines.append(f"| {name} | {value} | {'pass' if target['pass'] else '**FAIL**'} |")
    if data.get("without_training"):
        idle = data["without_training"]
        lines += ["", "## The same without training", "",
                  "Each condition again with a fresh victim that trains nothing, its loops watched for "
                  f"{data['settings']['idle_seconds']:.0f} s: the transport loop with neither the training "
                  "thread's GIL nor its load.", "", "| loop | clean | under attack |", "|---|---|---|"]  # fmt: skip
        for loop in ("transport", "reference", "collector"):
            stalls = [idle[condition]["loop_stall"][loop] for condition in ("clean", "attack")]
            cells = [f"{x['longest_s'] * 1000:.0f} ms longest, {x['over_100ms']} over 100 ms" for x in stalls]
            lines.append(
                f"| {'garbage collector (its pauses)' if loop == 'collector' else loop} | {cells[0]} | {cells[1]} |"
            )
    lines += ["", "## What the hostile peer sent", "", "| what | count |", "|---|---|"]
    lines += [f"| {name} | {count} |" for name, count in sorted(attack["attacker_sent"].items())]
    lines += [
        "",
        "## The victim transport's rejects by reason",
        "",
        "| reason | clean | under attack |",
        "|---|---|---|",
    ]
    for reason in sorted(set(clean["rejects"]) | set(attack["rejects"])):
        lines.append(f"| {reason} | {clean['rejects'].get(reason, 0)} | {attack['rejects'].get(reason, 0)} |")
    return lines
