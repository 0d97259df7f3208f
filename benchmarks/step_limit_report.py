"""The page of `benchmarks.step_limit`: its report lines and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness import pyplot
from benchmarks.machine_limits import GENERATIONS, NEW_TOKENS, PROMPTS

RANDOM_WEIGHTS_NOTE = "random weights of the default model's shapes: timings only"
SPLIT = ("generation", "scoring", "swarm", "plausibility", "training pass", "optimizer and rest")


def report_lines(data: dict[str, Any], record: dict[str, str]) -> list[str]:
    """The Markdown report. On a GPU wall seconds only (the CPU seconds of a process that waits for the GPU measure
    nothing), and the node's GPU defaults named."""
    s, gen, summary = data["settings"], data["generation"]["variants"], data["step_summary"]
    gpu = s.get("device", "cpu") != "cpu"
    fp32 = data["bounds"]["float32"]
    today = gen["today (TRL generate, fp32)"]
    where = f"{s['threads']} torch threads" if not gpu else f"device cuda ({s.get('gpu')})"
    native = f"Native bf16 on this CPU: {s['native_bf16']}." if not gpu else f"bf16 on this GPU: {s['native_bf16']}."
    lines = [
        "# The step at the machine's speed (`python -m benchmarks.step_limit`)", "",
        f"Command `{record['command']}`, commit {record['git_commit']}, {record['date']}, {record['machine']}; "
        f"{where}; load average {data['load_average']['start'][0]:.1f} at start, "
        f"{data['load_average']['end'][0]:.1f} at end; {data['elapsed_seconds'] / 60:.1f} min.", "",
        f"Model {s['model']} with LoRA r=16; {PROMPTS} prompts x {GENERATIONS} completions ({s['prompt_tokens_mean']} "
        f"prompt tokens on average), {NEW_TOKENS} new tokens. {native}", "",
    ]  # fmt: skip
    if s.get("random_weights"):
        lines += [f"**{RANDOM_WEIGHTS_NOTE[0].upper()}{RANDOM_WEIGHTS_NOTE[1:]}.** Every completion runs to its "
                  f"{NEW_TOKENS} tokens, so the work does not depend on the weights; rewards, accuracy and the text "
                  "sampled mean nothing.", ""]  # fmt: skip
    if gpu:
        lines += ["On the GPU: wall seconds only (the CPU mostly waits for the GPU; its seconds measure nothing), "
                  "every timing waits for the GPU (`torch.cuda.synchronize`). The node's configurations run as the "
                  "node does on a GPU (`sapo.speed.devices.device_defaults`: gradient checkpointing on, bf16 autocast "
                  "where named); plain TRL runs with TRL's own defaults there (bf16 where measured, gradient "
                  "checkpointing on).", ""]  # fmt: skip
    bandwidth = "Memory read bandwidth" if not gpu else "GPU memory bandwidth (device-to-device copy, read + written)"
    lines += [
        "## The machine", "",
        f"{bandwidth}: {data['limits']['bandwidth_gb_s']:.1f} GB/s.", "",
        "| matmul (phase, layer) | " + " | ".join(f"{d} GFLOP/s" for d in data["limits"]["rates_gflop_s"]) + " |",
        "|---|" + "---:|" * len(data["limits"]["rates_gflop_s"]),
    ]  # fmt: skip
    rates = data["limits"]["rates_gflop_s"]
    for shape in next(iter(rates.values())):
        lines.append(f"| {shape} | " + " | ".join(f"{r[shape]:.0f}" for r in rates.values()) + " |")
    lines += ["", "## Generation of the default step (fixed length)", ""]
    if gpu:
        lines += ["| variant | wall s | x today (wall) | wall / bound |", "|---|---:|---:|---:|"]
    else:
        lines += ["| variant | wall s | CPU s | x today (wall) | x today (CPU) | wall / fp32 bound |",
                  "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, v in gen.items():
        bound = data["bounds"].get("bfloat16", fp32)["generation"] if "bf16" in name else fp32["generation"]
        if gpu:
            lines.append(f"| {name} | {v['wall']:.3f} | {v['wall'] / today['wall']:.2f} | {v['wall'] / bound:.1f} |")
            continue
        lines.append(f"| {name} | {v['wall']:.2f} | {v['cpu']:.2f} | {v['wall'] / today['wall']:.2f} | "
                     f"{v['cpu'] / today['cpu']:.2f} | {v['wall'] / bound:.1f} |")  # fmt: skip
    for name, note in data["generation"]["notes"].items():
        lines.append(f"\n{name}: {note}")
    digits, step_digits = (4, 3) if gpu else (2, 2)
    lines += ["", "Lower bounds (s): " + "; ".join(
        f"{d}: generation {b['generation']:.{digits}f} (prefill {b['generation_prefill']:.{digits}f}, decode "
        f"{b['generation_decode']:.{digits}f}), training pass {b['training pass']:.{digits}f}, plausibility "
        f"{b['plausibility']:.{digits}f}"
        for d, b in data["bounds"].items())]  # fmt: skip
    lines += ["", "## The default node's step (1 local + 1 swarm group of 4; TRL: 2 local groups)", "",
              "| configuration | step wall s | " + ("" if gpu else "step CPU s | ")
              + "x today (wall) | x plain TRL (wall) | " + " | ".join(SPLIT) + " | swarm groups | steps |",
              "|---|---:|" + ("" if gpu else "---:|") + "---:|---:|" + "---:|" * len(SPLIT) + "---:|---:|"]  # fmt: skip
    today_step, trl_step = summary.get("node, speed-ups off (today)"), summary.get("plain TRL GRPOTrainer")

    def ratio(v: dict[str, Any], to: dict[str, Any] | None) -> str:
        return f"{v['wall'] / to['wall']:.2f}" if to else "-"

    for name, v in summary.items():
        measured = f"{v['steps_measured']} of {v.get('steps_after_first', v['steps_measured'])}"
        cpu = "" if gpu else f"{v['cpu']:.2f} | "
        lines.append(f"| {name} | {v['wall']:.{step_digits}f} | {cpu}{ratio(v, today_step)} | {ratio(v, trl_step)} | "
                     + " | ".join(f"{v[p]:.{step_digits}f}" for p in SPLIT)
                     + f" | {v['external_groups']:.0f} | {measured} |")  # fmt: skip
    lines += ["", "Medians over the steps after the first (the node's first step has no swarm group) that trained on "
              "the configuration's swarm groups (a node's step whose swarm group was dropped generates one more "
              "group instead: another step); *steps*: those measured of those after the first. Configurations take "
              "their steps in turns."]  # fmt: skip
    return lines


def plot(data: dict[str, Any], path: Path) -> None:
    """Generation variants (wall and CPU, with the fp32 bound) and the step split of each configuration."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    gen = data["generation"]["variants"]
    names = list(gen)
    x = range(len(names))
    left.bar([i - 0.2 for i in x], [gen[n]["wall"] for n in names], 0.4, label="wall")
    if data["settings"].get("device", "cpu") == "cpu":  # on a GPU the CPU seconds measure nothing
        left.bar([i + 0.2 for i in x], [gen[n]["cpu"] for n in names], 0.4, label="CPU")
    left.axhline(data["bounds"]["float32"]["generation"], color="k", ls="--", label="fp32 lower bound")
    left.set_xticks(list(x), names, rotation=25, ha="right", fontsize=8)
    left.set_ylabel("seconds")
    left.set_title("generation of the default step (8 x 48 tokens)")
    left.legend()
    summary = data["step_summary"]
    bottom = [0.0] * len(summary)
    for phase in SPLIT:
        values = [summary[n][phase] for n in summary]
        right.bar(range(len(summary)), values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xticks(range(len(summary)), list(summary), rotation=25, ha="right", fontsize=8)
    right.set_ylabel("seconds (wall, median step)")
    right.set_title("step split")
    right.legend(fontsize=7)
    fig.suptitle(f"step_limit at {data['record']['git_commit'][:12]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
