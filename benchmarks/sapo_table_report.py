"""The SAPO table's report: per-run summaries from the nodes' metrics, the I/J table with its diagnostics and noise
check, the verdict, the plot and the notes (for `benchmarks.sapo_table`)."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    code_label,
    pyplot,
    write_report,
)
from benchmarks.sharing_counts import counts_by_node, sharing_lines

PAPER_GROUPS = 8
PAPER_SETTINGS = ("8/0", "6/2", "4/4", "2/6")
PAPER_CUMULATIVE = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}
BASELINE = "8/0"
CPU_SIZING = {
    "measured": "2026-11-22, `--profile cpu --settings 8/0,4/4 --seeds 0,1` (run as 2/0 and 1/1; G=4, 64 tokens, "
    "per-device batch 4): median 74 s per step with 4 nodes alone on 2 cores (1/1, seed 0); 146-154 s while "
    "tests shared the CPU; startup ~80 s. The profile's first sizing (4 groups per step, 2026-11-22, "
    "`--sizing 3`) measured ~190 s per step under load, i.e. ~10 steps per 30 minutes",
    "seconds_per_step_4_peers": 75.0,
    "steps_for_30_minutes": 10,
}


REPLAY_MARK = "r"
"""A setting label ending in it (e.g. ``4/4r``) fills its J slots by self-replay instead of the swarm
(``--replay only``): the control of experiment 3."""


def parse_setting(label: str) -> tuple[int, int]:
    """'4/4' -> (4, 4): a paper setting, I local / J external groups out of 8 (``4/4r``: J by self-replay)."""
    try:
        i, j = (int(x) for x in label.strip().removesuffix(REPLAY_MARK).split("/"))
    except ValueError:
        raise ValueError(f"a setting is I/J, e.g. 4/4 (4/4r: J filled by self-replay); got {label!r}") from None
    if i < 0 or j < 0 or i + j != PAPER_GROUPS:
        raise ValueError(f"setting {label!r}: I + J must be {PAPER_GROUPS} (the paper's settings), e.g. 6/2")
    if i == 0:
        raise ValueError(f"setting {label!r}: I must be at least 1 (the table measures the peers' own completions)")
    if is_replay(label) and j == 0:
        raise ValueError(f"setting {label!r}: self-replay needs J of at least 1")
    return i, j


def is_replay(label: str) -> bool:
    """Whether setting ``label`` fills its J slots by self-replay (``4/4r``) instead of the swarm."""
    return label.strip().endswith(REPLAY_MARK)


def scale_setting(label: str, groups_per_step: int) -> tuple[int, int]:
    """The paper's I/J out of 8 scaled to ``groups_per_step`` groups; it must scale to whole groups."""
    i, j = parse_setting(label)
    if (i * groups_per_step) % PAPER_GROUPS:
        raise ValueError(
            f"setting {label} does not scale to whole groups with {groups_per_step} groups per step; "
            f"use a multiple of {PAPER_GROUPS // math.gcd(i, PAPER_GROUPS)} groups"
        )
    local = i * groups_per_step // PAPER_GROUPS
    return local, groups_per_step - local


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def load_metrics(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One node's metrics.jsonl: its training lines sorted by step, one per step (the last line of a step wins),
    and its held-out evaluation lines, one per step, likewise."""
    from sapo.node.report import split_lines

    try:
        text = path.read_text()
    except FileNotFoundError:
        return [], []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed node
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    training, evaluations = split_lines(rows)
    by_step = {int(r["step"]): r for r in training}
    return [by_step[s] for s in sorted(by_step)], evaluations


PER_STEP_KEYS = {  # JSON name: metrics.jsonl key
    "local_reward": "sapo/local_reward",
    "external_reward": "sapo/external_reward",
    # local groups whose rewards differ: what the paper sampler would keep of them (like with like for external)
    "local_reward_with_spread": "sapo/local_reward_with_spread",
    "external_groups": "sapo/external_groups",
    "fill_ins": "sapo/fill_ins",
    "zero_std_fraction": "frac_reward_zero_std",  # TRL: groups whose G rewards are all equal (no gradient)
    "time": "time",
}


TOTAL = "sapo/total/"


def load_run(run_dir: Path, peers: int, steps: int) -> dict[str, dict[str, list[float]]]:
    """Per node: steps and per-step figures (NaN where a step did not log one), held-out pass@1 by evaluated
    step (`held_out_steps`, `held_out`), steps beyond ``steps`` cut; and what sharing carried, from its group log
    (`sharing`: :mod:`benchmarks.sharing_counts`; empty without one)."""
    sharing = counts_by_node(run_dir)
    out = {}
    for i in range(peers):
        training, evaluations = load_metrics(run_dir / f"node-{i}" / "metrics.jsonl")
        rows = [r for r in training if r["step"] <= steps]
        node = {"steps": [int(r["step"]) for r in rows]}
        for name, key in PER_STEP_KEYS.items():
            node[name] = [_float(r.get(key)) for r in rows]
        evaluated = [r for r in evaluations if r["step"] <= steps]
        node["held_out_steps"] = [int(r["step"]) for r in evaluated]
        node["held_out"] = [_float(r.get("eval/pass@1")) for r in evaluated]
        # the intake's running totals at the node's last step: groups offered, taken, and dropped by reason
        last = rows[-1] if rows else {}
        node["intake_totals"] = {k.removeprefix(TOTAL): _float(v) for k, v in last.items() if k.startswith(TOTAL)}
        node["sharing"] = dict(sharing.get(f"node-{i}", {}))
        out[f"node-{i}"] = node
    return out


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def run_summary(nodes: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Cumulative and mean local reward of one run, external groups taken, seconds per step."""
    rewards = [v for node in nodes.values() for v in _finite(node["local_reward"])]
    durations = []
    for node in nodes.values():
        times = node["time"]
        durations += [b - a for a, b in zip(times, times[1:], strict=False) if not (math.isnan(a) or math.isnan(b))]
    external = [v for node in nodes.values() for v in _finite(node["external_groups"])]
    fill_ins = [v for node in nodes.values() for v in _finite(node["fill_ins"])]
    last_step = max((s for node in nodes.values() for s in node["steps"]), default=0)

    def mean_of(name: str, first_half: bool | None = None) -> float:
        values = [
            v
            for node in nodes.values()
            for s, v in zip(node["steps"], node[name], strict=True)
            if not math.isnan(v) and (first_half is None or (2 * s <= last_step) == first_half)
        ]
        return statistics.mean(values) if values else math.nan

    return {
        "cumulative_reward": sum(rewards),
        "peer_steps": len(rewards),
        "mean_reward": sum(rewards) / len(rewards) if rewards else math.nan,
        "external_groups_per_step": statistics.mean(external) if external else math.nan,
        "fill_ins_per_step": statistics.mean(fill_ins) if fill_ins else math.nan,
        "seconds_per_step_median": statistics.median(durations) if durations else math.nan,
        # diagnostics: does the policy move (first vs second half), is there a gradient at all (groups whose G
        # completions all got the same reward have zero advantage), and how good are the groups of others
        # standard error of the mean reward per peer-step (peer-steps taken as independent draws)
        "mean_reward_se": statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else math.nan,
        "reward_first_half": mean_of("local_reward", first_half=True),
        "reward_second_half": mean_of("local_reward", first_half=False),
        "zero_std_fraction": mean_of("zero_std_fraction"),
        "external_reward": mean_of("external_reward"),
        "local_reward_with_spread": mean_of("local_reward_with_spread"),
        # held-out greedy pass@1, mean over peers, at each peer's first and last evaluation
        "held_out_start": _mean_of_ends(nodes, first=True),
        "held_out_end": _mean_of_ends(nodes, first=False),
        "intake_totals": _summed([node.get("intake_totals", {}) for node in nodes.values()]),
        "sharing": _summed([node.get("sharing", {}) for node in nodes.values()]),
    }


def _summed(counts: Sequence[dict[str, float]]) -> dict[str, float]:
    """Counts added up key by key (NaN counts skipped)."""
    total: dict[str, float] = {}
    for count in counts:
        for key, value in count.items():
            if not math.isnan(value):
                total[key] = total.get(key, 0.0) + value
    return dict(sorted(total.items()))


def _mean_of_ends(nodes: dict[str, dict[str, list[float]]], first: bool) -> float:
    values = _finite([node["held_out"][0 if first else -1] for node in nodes.values() if node.get("held_out")])
    return statistics.mean(values) if values else math.nan


def _spread(values: list[float]) -> dict[str, float]:
    values = _finite(values)  # a figure a run did not log (NaN) does not count
    return {
        "mean": statistics.mean(values) if values else math.nan,
        "std": statistics.stdev(values) if len(values) > 1 else math.nan,
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


DIAGNOSTICS = (
    "reward_first_half", "reward_second_half", "zero_std_fraction", "external_reward", "local_reward_with_spread",
    "held_out_start", "held_out_end",
)  # fmt: skip


def table(runs: list[dict[str, Any]], settings: Sequence[str]) -> list[dict[str, Any]]:
    """One row per setting: cumulative and mean reward over seeds (mean, std, min, max), gain vs 8/0.

    Only complete runs count. The gain is mean cumulative(setting) / mean cumulative(8/0) - 1; its spread is
    the min-max of the per-seed gains cumulative(setting, s) / cumulative(8/0, s) - 1 over seeds both ran.
    """
    by_setting: dict[str, dict[int, dict[str, Any]]] = {}
    for run in runs:
        if run["complete"]:
            by_setting.setdefault(run["setting"], {})[run["seed"]] = run
    base = by_setting.get(BASELINE, {})
    base_mean = _spread([r["cumulative_reward"] for r in base.values()])["mean"]
    rows = []
    for label in settings:
        done = by_setting.get(label, {})
        cumulative = _spread([r["cumulative_reward"] for r in done.values()])
        paired = [
            done[s]["cumulative_reward"] / base[s]["cumulative_reward"] - 1
            for s in sorted(done)
            if s in base and base[s]["cumulative_reward"] > 0
        ]
        gain = cumulative["mean"] / base_mean - 1 if base and base_mean > 0 and done else math.nan
        first = next((r for r in runs if r["setting"] == label), {})
        rows.append(
            {
                "setting": label,
                "run_as": f"{first.get('num_local', '?')}/{first.get('num_external', '?')}",
                "seeds": sorted(done),
                "cumulative_reward": cumulative,
                "mean_reward": _spread([r["mean_reward"] for r in done.values()]),
                "gain": gain,
                "gain_per_seed": {"min": min(paired), "max": max(paired)} if paired else None,
                "external_groups_per_step": _spread([r["external_groups_per_step"] for r in done.values()])["mean"],
                "fill_ins_per_step": _spread([r["fill_ins_per_step"] for r in done.values()])["mean"],
                "seconds_per_step_median": _spread([r["seconds_per_step_median"] for r in done.values()])["mean"],
                **{name: _spread([r[name] for r in done.values()])["mean"] for name in DIAGNOSTICS},
                "intake_totals": _summed([r.get("intake_totals", {}) for r in done.values()]),
                "sharing": _summed([r.get("sharing", {}) for r in done.values()]),
                "paper_cumulative": PAPER_CUMULATIVE.get(label),
                "paper_gain": PAPER_CUMULATIVE[label] / PAPER_CUMULATIVE[BASELINE] - 1
                if label in PAPER_CUMULATIVE
                else None,
            }
        )
    return rows


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 100:+.0f}%"


def format_table(rows: list[dict[str, Any]]) -> list[str]:
    """The table as markdown lines."""
    lines = [
        "| I/J (paper) | run as | seeds | cumulative reward, mean over seeds | min-max | std | mean reward per "
        "peer-step | gain vs 8/0 | per-seed gain min-max | external groups taken / step | fill-ins / step "
        "| s / step (median) | paper cumulative (gain) |",
        "|---" * 13 + "|",
    ]
    for r in rows:
        c, m = r["cumulative_reward"], r["mean_reward"]
        per_seed = r["gain_per_seed"]
        seed_gains = "-" if per_seed is None else f"{_pct(per_seed['min'])} to {_pct(per_seed['max'])}"
        paper = "-" if r["paper_cumulative"] is None else f"{r['paper_cumulative']:.2f} ({r['paper_gain']:+.1%})"
        lines.append(
            f"| {r['setting']} | {r['run_as']} | {','.join(map(str, r['seeds'])) or '-'} | {_fmt(c['mean'])} "
            f"| {_fmt(c['min'])}-{_fmt(c['max'])} | {_fmt(c['std'])} | {_fmt(m['mean'], '.4f')} "
            f"| {_pct(r['gain'])} | {seed_gains} "
            f"| {_fmt(r['external_groups_per_step'])} | {_fmt(r['fill_ins_per_step'])} "
            f"| {_fmt(r['seconds_per_step_median'], '.1f')} | {paper} |"
        )
    return lines


def format_diagnostics(rows: list[dict[str, Any]]) -> list[str]:
    """Per setting, means over seeds: reward in the first and second half of the run, the fraction of groups
    with zero advantage (no gradient), the mean reward of the external groups taken and of the local groups with
    reward spread (the paper sampler keeps only such external groups: like with like), and held-out pass@1 (mean
    over peers) at the first and last evaluation."""
    lines = [
        "| I/J (paper) | local reward, first half | second half | groups with zero reward spread (no gradient) "
        "| external groups' reward | local groups with reward spread: reward | held-out pass@1, start | end |",
        "|---" * 8 + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {_fmt(r['reward_first_half'], '.4f')} | {_fmt(r['reward_second_half'], '.4f')} "
            f"| {_pct_plain(r['zero_std_fraction'])} | {_fmt(r['external_reward'], '.4f')} "
            f"| {_fmt(r['local_reward_with_spread'], '.4f')} | {_fmt(r['held_out_start'], '.3f')} "
            f"| {_fmt(r['held_out_end'], '.3f')} |"
        )
    return lines


def format_intake(rows: list[dict[str, Any]]) -> list[str]:
    """Per setting that takes external groups, summed over its seeds and peers: the groups fetched, trained on, and
    dropped by reason; the share of the sampler's choices the plausibility check dropped (in a swarm of honest
    peers, the honest groups the trust defence costs)."""
    lines = []
    for r in rows:
        totals = r.get("intake_totals") or {}
        if not totals.get("candidates"):
            continue
        taken, implausible = totals.get("external_groups", 0.0), totals.get("dropped/implausible", 0.0)
        dropped = ", ".join(
            f"{k.removeprefix('dropped/')} {v:.0f}" for k, v in totals.items() if k.startswith("dropped/")
        )
        share = implausible / (taken + implausible) if taken + implausible else math.nan
        lines.append(
            f"- {r['setting']}: {totals['candidates']:.0f} groups fetched, {taken:.0f} trained on, "
            f"{totals.get('fill_ins', 0.0):.0f} slots filled in locally; dropped: {dropped or 'none'}. The "
            f"plausibility check dropped {implausible:.0f} of the {taken + implausible:.0f} groups the sampler chose "
            f"({_pct_plain(share)}; every peer here is honest; a run whose code predates the check counts 0)."
        )
    return lines


def _pct_plain(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 100:.0f}%"


def noise_check(runs: list[dict[str, Any]], settings: Sequence[str]) -> list[str]:
    """Per seed, the difference of mean reward per peer-step against 8/0, in units of its standard error; over the
    seeds, the mean difference with the plain t-interval over seeds (each seed trains on its own questions, so the
    seeds' spread holds all the noise)."""
    from benchmarks.stats import t_over_seeds

    complete = {(r["setting"], r["seed"]): r for r in runs if r["complete"]}
    out = []
    for label in settings:
        if label == BASELINE:
            continue
        differences = []
        for seed in sorted({s for (lab, s) in complete if lab == label}):
            run, base = complete[(label, seed)], complete.get((BASELINE, seed))
            if base is None:
                continue
            diff = run["mean_reward"] - base["mean_reward"]
            differences.append(diff)
            se = math.sqrt(run["mean_reward_se"] ** 2 + base["mean_reward_se"] ** 2)
            out.append(
                f"- {label} seed {seed}: mean reward per peer-step {run['mean_reward']:.4f} vs "
                f"{base['mean_reward']:.4f} (8/0): difference {diff:+.4f} = {diff / se:+.1f} standard errors "
                f"(SE {se:.4f}, from the per-step spread over peers and steps)."
            )
        if len(differences) > 1:
            over = t_over_seeds(differences)
            low, high = over.interval()
            out.append(
                f"- {label}, over {len(differences)} seeds: {over.value:+.4f} (95 % CI {low:+.4f} to {high:+.4f}, "
                "t-interval over the seeds)."
            )
    return out or ["- No seed has both a complete 8/0 run and a complete shared run."]


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """Plain statements of whether sharing helped at this scale (no analysis)."""
    if not any(r["seeds"] for r in rows):
        return ["- No run is complete: nothing was measured yet."]
    base = next((r for r in rows if r["setting"] == BASELINE), None)
    if base is None or not base["seeds"]:
        return ["- No complete 8/0 baseline run: no gain can be stated."]
    out = []
    for r in rows:
        if r["setting"] == BASELINE or not r["seeds"]:
            continue
        per_seed = r["gain_per_seed"]
        if math.isnan(r["gain"]):
            out.append(f"- {r['setting']}: no gain can be computed (baseline cumulative reward is 0).")
        elif per_seed and per_seed["min"] > 0:
            out.append(f"- {r['setting']}: sharing helped in every seed ({_pct(r['gain'])} on the seed mean).")
        elif per_seed and per_seed["max"] < 0:
            out.append(f"- {r['setting']}: sharing did NOT help: lower in every seed ({_pct(r['gain'])}).")
        else:
            out.append(
                f"- {r['setting']}: no consistent effect: {_pct(r['gain'])} on the seed mean, but the per-seed "
                "gains have both signs (within the seed spread)."
            )
    return out


def format_run_codes(runs: list[dict[str, Any]]) -> list[str]:
    """One line per complete run: the commit it ran on (and whether the tree was clean) and how long it took."""
    lines = []
    for run in runs:
        if not run["complete"]:
            continue
        commit = code_label(run.get("code") or {}, 10)
        minutes = (run.get("last_attempt_seconds") or math.nan) / 60
        lines.append(f"- {run['setting']} seed {run['seed']}: commit {commit}, last attempt {minutes:.0f} min")
    return lines or ["- No run is complete yet."]


def write_outputs(report: dict[str, Any], results_dir: Path) -> dict[str, Path]:
    """sapo_table_<profile>.json, .md and .png in ``results_dir``."""
    stem = f"sapo_table_{report['config']['profile']}"
    config = report["config"]
    lines = [
        f"# SAPO experience-sharing table, profile `{config['profile']}`",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{report['git_commit']}`, {report['date']}, {report['machine']}  ",
        f"Setup: {report['setup']}",
        "",
        *format_table(report["table"]),
        "",
        "Diagnostics (means over seeds and peers):",
        "",
        *format_diagnostics(report["table"]),
        "",
        *(
            ["Intake (summed over seeds and peers):", "", *intake, ""]
            if (intake := format_intake(report["table"]))
            else []
        ),
        "What sharing carried, from the nodes' group logs (summed over seeds and peers; benchmarks/sharing_counts.py):",
        "",
        *sharing_lines([(r["setting"], Counter(r.get("sharing") or {})) for r in report["table"]]),
        "",
        "## Did sharing help at this scale?",
        "",
        *verdict(report["table"]),
        "",
        "Is the difference larger than the noise? (|difference| under ~2 standard errors is not)",
        "",
        *noise_check(report["runs"], config["settings"]),
        "",
        "## Runs and the code they ran on",
        "",
        *format_run_codes(report["runs"]),
        "",
        "## Notes",
        "",
        *report["notes"],
    ]
    paths = write_report(results_dir, stem, report, lines)
    paths["png"] = plot(report, results_dir / f"{stem}.png")
    return paths


def seed_curve(run: dict[str, Any], steps: int) -> list[float]:
    """Per step 1..steps: the mean over peers of local_reward (NaN where no peer logged one)."""
    sums, counts = [0.0] * steps, [0] * steps
    for node in run["peers"].values():
        for step, value in zip(node["steps"], node["local_reward"], strict=True):
            if 1 <= step <= steps and not math.isnan(value):
                sums[step - 1] += value
                counts[step - 1] += 1
    return [s / c if c else math.nan for s, c in zip(sums, counts, strict=True)]


def plot(report: dict[str, Any], path: Path) -> Path:
    """Moving average of the local reward per setting (mean over peers and seeds), band = min-max over seeds."""
    from sapo.node.report import moving_average

    plt = pyplot()

    config = report["config"]
    steps, window = config["steps"], config["window"]
    fig, (ax, ax_cum) = plt.subplots(1, 2, figsize=(13, 4.8))
    x = list(range(1, steps + 1))
    for label in config["settings"]:
        runs = [r for r in report["runs"] if r["setting"] == label and r["complete"]]
        if not runs:
            continue
        curves = [moving_average(seed_curve(r, steps), window) for r in runs]
        cumulative = []
        for r in runs:
            total, acc = 0.0, []
            for v in seed_curve(r, steps):
                total += 0.0 if math.isnan(v) else v * config["peers"]
                acc.append(total)
            cumulative.append(acc)
        name = f"{label} (run as {runs[0]['num_local']}/{runs[0]['num_external']}), {len(runs)} seed(s)"
        for ax_, ys in ((ax, curves), (ax_cum, cumulative)):
            columns = [[c[k] for c in ys if not math.isnan(c[k])] for k in range(steps)]
            mean = [statistics.mean(col) if col else math.nan for col in columns]
            line = ax_.plot(x, mean, label=name)[0]
            if len(ys) > 1:
                low = [min(col) if col else math.nan for col in columns]
                high = [max(col) if col else math.nan for col in columns]
                ax_.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
    ax.set(
        title=f"Reward of the peers' own completions ({window}-step moving average; band: seeds min-max)",
        xlabel="step",
        ylabel="local reward (mean over peers and seeds)",
    )
    ax_cum.set(
        title="Cumulative reward (sum over peers of the per-step mean x peers)",
        xlabel="step",
        ylabel="cumulative local reward",
    )
    for a in (ax, ax_cum):
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=8)
        else:
            a.text(0.5, 0.5, "no complete run yet", ha="center", va="center", transform=a.transAxes)
    ax.title.set_fontsize(9)
    ax_cum.title.set_fontsize(9)
    fig.suptitle(f"SAPO sharing table, profile {config['profile']}: {config['peers']} peers", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def notes(config: dict[str, Any], runs: list[dict[str, Any]], outcome: dict[str, Any] | None) -> list[str]:
    out = [
        "- Cumulative reward: sum over peers and steps of `sapo/local_reward`, the mean reward (under the "
        f"node's reward functions: {', '.join(config['rewards'])}) of the completions a node generated itself "
        "that step (its I local groups plus any fill-in groups it generated when the swarm had fewer than J "
        "usable ones). External completions never count. Mean reward per peer-step = cumulative / peer-steps.",
        "- Gain vs 8/0: mean over seeds of the cumulative reward / that of 8/0, minus 1; per-seed gain: the same "
        "ratio for each seed (same seeds, tasks and settings in every I/J), min-max over seeds.",
        "- Cumulative rewards depend on peers x steps and on the model, tasks and reward: compare gains with the "
        "paper's, not the absolute numbers.",
        f"- Each run is `sapo-node local-swarm` with {config['peers']} node processes on 127.0.0.1 joined through a "
        "bootstrap DHT peer (real hivemind DHT, loopback); runs are sequential, each in its own swarm. Node i "
        "of the swarm of seed S uses seed 100*S + i.",
    ]
    if config["groups_per_step"] != PAPER_GROUPS:
        scaled = [scale_setting(s, config["groups_per_step"]) for s in config["settings"]]
        out.append(
            f"- I + J scaled from the paper's 8 groups per step to {config['groups_per_step']}: the paper's "
            f"{', '.join(config['settings'])} run as {', '.join(f'{i}/{j}' for i, j in scaled)}."
        )
    out.append(
        "- External groups taken / step below J means the swarm did not always have J usable groups "
        "(e.g. at the start, or with the paper sampler dropping zero-advantage groups); the missing ones were "
        "generated locally (fill-ins) and count as local."
    )
    out += [f"- {n}" for n in config["profile_notes"]]
    if config["profile"] == "cpu":
        out.append(
            f"- cpu sizing: {CPU_SIZING['measured']}; {config['steps']} steps per run; SmolLM2-135M-Instruct, "
            f"default easy task mix, learning rate {config['learning_rate']}, {config['max_completion_length']} "
            f"new tokens, G={config['num_generations']}."
        )
    incomplete = [r for r in runs if not r["complete"]]
    if incomplete:
        out.append(
            "- Not run or not complete (excluded from the table): "
            + ", ".join(f"{r['setting']} seed {r['seed']}" for r in incomplete)
            + "; run the same command again to resume them."
        )
    if outcome is not None:
        out.append(
            f"- This invocation: {len(outcome['started'])} swarm run(s) started, {len(outcome['skipped'])} "
            f"complete run(s) skipped, {len(outcome['failed'])} failed."
        )
    out.append("- Whether and why sharing helps here is analysed separately; this page only reports the figures.")
    return out
