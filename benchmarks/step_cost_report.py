"""The step-cost benchmark's report: step_cost.json, .md (the split per configuration, ratios to TRL) and .png, with
the notes that say how to read them (for `benchmarks.step_cost`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness import pyplot, write_report

SPLIT = ("generation", "scoring", "swarm", "training")


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``; None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def fmt_value(value: float | None, spec: str = "{:.2f}") -> str:
    return "-" if value is None else spec.format(value)


def step_cost_table(result: dict[str, Any]) -> list[str]:
    """Markdown rows: one per configuration, medians in seconds."""
    lines = [
        "| configuration | steps | step_time s (min-max) | wall s | step_time / trl | generation s | scoring s "
        "| swarm s (fetch / ext. scoring / publish) | training s | swarm share | ext. groups | fill-ins "
        "| completion tokens |",
        "|---" * 13 + "|",
    ]
    trl = result["summary"].get("trl", {}).get("step_time")
    for name, s in result["summary"].items():
        p, split = s["phases"], s["split"]
        lo, hi = s["step_time_min_max"]
        lines.append(
            f"| {name} | {s['steps_measured']} | {s['step_time']:.2f} ({lo:.2f}-{hi:.2f}) | {fmt_value(s['wall'])} "
            f"| {fmt_value(ratio(s['step_time'], trl), '{:.3f}')} | {split['generation']:.2f} | {split['scoring']:.3f} "
            f"| {split['swarm']:.3f} ({p['swarm_fetch']:.4f} / {p['external_scoring']:.3f} / {p['publish']:.4f}) "
            f"| {split['training']:.2f} | {fmt_value(s['swarm_share'], '{:.2%}')} "
            f"| {fmt_value(s['external_groups'], '{:.0f}')} "
            f"| {fmt_value(s['fill_ins'], '{:.0f}')} | {fmt_value(s['completion_tokens'], '{:.0f}')} |"
        )
    return lines


def write_step_cost(result: dict[str, Any], out: Path, notes: list[str]) -> None:
    """step_cost.json, .md (table, ratios, background CPU) and .png (phase split, ratios) in ``out``."""
    ratio_lines = [
        f"- {pair}: step_time {fmt_value(r['step_time'], '{:.3f}')}, wall {fmt_value(r['wall'], '{:.3f}')}"
        for pair, r in result["ratios"].items()
    ]
    cores = result["background_cpu_cores"]
    lines = [
        "# Step cost: SAPO peer (4/4, 8/0) against plain TRL GRPOTrainer",
        "",
        f"Command: `{result['command']}`  ",
        f"Commit: `{result['git_commit']}`, {result['date']}, {result['machine']}, "
        f"load average at start {result['load_average_at_start']}  ",
        f"Setup: {result['setup']}",
        "",
        *step_cost_table(result),
        "",
        "Ratios of medians:",
        *ratio_lines,
        "",
        f"Background CPU over the whole interleaved run ({result['elapsed_seconds']:.0f} s wall), in cores used on "
        f"average: DHT thread of the peer {cores['swarm_thread']:.3f}, its p2pd {cores['p2pd']:.3f}, the feeder "
        f"process with its p2pd {cores['feeder']:.3f}; the whole benchmark process {cores['process']:.2f}.",
        "",
        *notes,
    ]
    write_report(out, "step_cost", result, lines)

    plt = pyplot()
    names = list(result["summary"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    colors = {"generation": "#4C72B0", "scoring": "#DD8452", "swarm": "#C44E52", "training": "#55A868"}
    bottoms = [0.0] * len(names)
    for part in SPLIT:
        values = [result["summary"][n]["split"][part] for n in names]
        ax1.bar(names, values, bottom=bottoms, label=part, color=colors[part])
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    for i, n in enumerate(names):
        share = result["summary"][n]["swarm_share"]
        ax1.text(i, bottoms[i], f"{bottoms[i]:.1f} s\nswarm {share:.2%}", ha="center", va="bottom", fontsize=8)
    ax1.set_ylabel("seconds per optimizer step (median)")
    ax1.set_ylim(0, max(bottoms) * 1.2)
    ax1.set_title("Phase split of a step (TRL step_time)")
    ax1.legend(fontsize=8, loc="lower right")
    trl = result["summary"]["trl"]
    for k, key in enumerate(("step_time", "wall")):
        values = [ratio(result["summary"][n][key], trl[key]) or 0 for n in names]
        xs = [i + (k - 0.5) * 0.35 for i in range(len(names))]
        bars = ax2.bar(xs, values, width=0.35, label=key)
        for bar, v in zip(bars, values, strict=True):
            ax2.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_xticks(range(len(names)), names)
    ax2.set_ylabel("median step time / plain TRL")
    ax2.set_title("Step-time ratio")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "step_cost.png", dpi=120)
    plt.close(fig)


STEP_NOTES = [
    "- Three trainers in one process, from the same weights, dataset and seed, taking turns step by step "
    "(order in the JSON); medians over the steps after each trainer's first (warm-up) step.",
    "- step_time is TRL's: the wall time of `training_step` summed over the round's micro-batches (generation, "
    "scoring, log-probs, forward and backward), without the optimizer step; wall is the whole optimizer step "
    "(step-begin to step-end callbacks, optimizer included).",
    "- generation, scoring, swarm fetch, external scoring and publish are SAPOTrainer's `sapo/time/<phase>` "
    "(for plain TRL the same timers around `_generate` and `_calculate_rewards`). swarm = publish + swarm fetch + "
    "external scoring; training = step_time - generation - scoring - swarm. In the table each phase is its median "
    "and training = median step_time - the other medians, so the split adds up to the median step_time; the "
    "per-step medians are in the JSON (`split_of_steps`).",
    "- Left in training for the SAPO peer (timed here by the benchmark, `extra_timed` in the JSON): the sampler's "
    "choice (`select`) and the re-tokenization of external completions (`retokenize`).",
    "- bf16=False and gradient_checkpointing=False for all three (GRPOConfig defaults to bf16 autocast and "
    "gradient checkpointing; SAPOConfig leaves bf16 off on CPU). Same beta=0, epsilon 0.2/0.28, lr, G, batch.",
    "- The 4/4 peer's external groups come from a feeder: a second DHTTransport peer (own process, own p2pd, "
    "127.0.0.1) publishing 4 groups every feeder_interval seconds, built from reasoning-gym rows with their "
    "provenance (the receiver regenerates and checks each question) and synthetic completions: 37.5 % end "
    "with the right answer in <answer> tags and 37.5 % with a wrong one (20-70 % of max_completion_length tokens), "
    "25 % run to the length limit without an answer (clipped), as the model's own do. The pool is always full "
    "(fetch of 16 candidates per round), as in a swarm with enough peers.",
    "- The DHT peer's background thread and p2pd, and the feeder, run during all three trainers' steps: their "
    "CPU (below the ratios) is spread over all three configurations, not charged to the SAPO ones.",
]


# ------------------------------------------------------------------------------------------------
# main
