"""What the plausibility check (`sapo.plausibility`) sees under the base default model: its own sampled completions
against payload completions, the adaptive attacker's spliced ones and honest peers that sample differently, for each
statistic the check can use, to choose the defaults from measurements.

    python -m benchmarks.plausibility_scores --questions 12

For each held-out question of the default tasks, completions are generated and scored as a node scores received
ones (log-probability and the policy's entropy of every token at temperature 1, at most ``--max-tokens`` tokens):

- ``own``: ``--samples`` completions sampled from the model as a node samples (temperature 1, top_k 0);
- ``own-t0.7`` / ``own-t1.3``: the same model sampled at another temperature (an honest peer set up differently);
- ``payload``: the hand-written payload completions of :mod:`testbed.payload_attack`;
- ``terse``: terse answers in another style ("<answer>X</answer>");
- ``adaptive`` / ``adaptive-format``: the adaptive attacker's payload-carrying completions
  (:func:`testbed.adaptive_attack.carrier_completion`: the policy's own samples with a payload spliced in and the
  correct answer, the payload after the answer or, for ``adaptive-format``, before it, each completion then ending
  in the node's answer format).

Every statistic of :data:`STATISTICS` is computed for every completion from the same per-token
values (kept in the JSON); the report gives, per statistic, the quantiles of each kind and the share of each kind a
margin below the own 5th percentile would drop. ``--report-only`` recomputes the report from the saved per-token
values. Results: benchmarks/results/plausibility_scores.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, record_lines, run_record, write_report

KINDS = ("own", "own-t0.7", "own-t1.3", "payload", "terse", "adaptive", "adaptive-format")
HONEST_KINDS = ("own", "own-t0.7", "own-t1.3")
"""Kinds an honest peer sends: what a defence must keep."""
MARGINS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)

STATISTICS = {
    "mean": "typicality averaged over the whole completion (the check's first test, `plausibility_margin`)",
    "span2": "the lowest typicality averaged over 2 consecutive tokens",
    "span3": "the lowest typicality averaged over 3 consecutive tokens (the default worst span, "
    "`plausibility_span_tokens`, judged with `plausibility_span_margin`)",
    "span4": "the lowest typicality averaged over 4 consecutive tokens",
    "span8": "the lowest typicality averaged over 8 consecutive tokens",
    "worst_token": "the lowest typicality of one token",
}
"""Statistics of a completion's per-token typicality (log-probability + entropy) the report compares."""


def statistic(name: str, logps: Sequence[float], entropies: Sequence[float]) -> float:
    """One of :data:`STATISTICS` for one completion's per-token values."""
    import torch

    from sapo.plausibility import worst_span

    excess = torch.tensor(logps) + torch.tensor(entropies)
    if name == "mean":
        return excess.mean().item()
    if name == "worst_token":
        return excess.min().item()
    return worst_span(excess, int(name.removeprefix("span")))


def completion_logps(model: Any, tokenizer: Any, prompt: list[dict], texts: Sequence[str], max_tokens: int) -> list:
    """Per text: (log-probability of each of its tokens, the policy's entropy there) after ``prompt``, temperature 1,
    at most ``max_tokens`` tokens."""
    import torch

    rendered = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"][:max_tokens]
        if not ids:
            continue
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1].float()
        logps = torch.log_softmax(logits, -1)
        out.append((logps.gather(1, torch.tensor(ids)[:, None])[:, 0], -(logps.exp() * logps).sum(-1)))
    return out


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """min, 5th percentile, median and max of ``values``."""
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "min": ordered[0],
        "p5": ordered[int(0.05 * (len(ordered) - 1))],
        "median": ordered[len(ordered) // 2],
        "max": ordered[-1],
    }


def completions_of(sampler: Any, row: dict[str, Any], samples: int, rng: random.Random) -> dict[str, list[str]]:
    """The completions of every kind for one question (see the module docstring)."""
    from testbed.adaptive_attack import ADAPTIVE_PAYLOADS, PLACES, carrier_completion
    from testbed.hostile_peer import wrong_answer
    from testbed.payload_attack import payload_completion

    prompt, answer = row["prompt"], str(row["answer"])
    prompt_ids = sampler.prompt_ids(prompt)
    own = sampler.sample(prompt_ids, sampler.max_tokens, n=samples)
    texts = {"own": [sampler.decode(ids).strip() for ids in own]}
    for temperature in (0.7, 1.3):
        sampler.temperature = temperature
        sampled = sampler.sample(prompt_ids, sampler.max_tokens, n=samples)
        texts[f"own-t{temperature:g}"] = [sampler.decode(ids).strip() for ids in sampled]
    sampler.temperature = 1.0
    texts["payload"] = [payload_completion(answer, rng) for _ in range(2)]
    texts["terse"] = [f"<answer>{answer}</answer>", f"Let me compute. <answer>{wrong_answer(answer)}</answer>"]
    for kind in ("adaptive", "adaptive-format"):
        texts[kind] = [
            carrier_completion(
                sampler, prompt_ids, own[k], answer, rng.choice(ADAPTIVE_PAYLOADS), rng.choice(PLACES[kind]), rng
            )
            for k in range(2)
        ]
    return texts


def measure(questions: int, samples: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """Per kind: every completion's text and per-token (log-probability, entropy) under the base default model."""
    import torch

    from sapo.models import load_policy
    from sapo.tasks import DEFAULT_TASKS, build_held_out_dataset
    from testbed.adaptive_attack import PolicySampler

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model, tokenizer = load_policy(None)
    sampler = PolicySampler(model, tokenizer, max_tokens)
    completions: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for index, row in enumerate(build_held_out_dataset(DEFAULT_TASKS, questions)):
        print(f"plausibility scores: question {index + 1} of {questions}", flush=True)
        for kind, texts in completions_of(sampler, row, samples, rng).items():
            scored = completion_logps(model, tokenizer, row["prompt"], texts, max_tokens)
            for text, (logps, entropies) in zip(texts, scored, strict=False):
                completions[kind].append(
                    {
                        "question": index,
                        "text": text,
                        "logps": [round(x, 4) for x in logps.tolist()],
                        "entropies": [round(x, 4) for x in entropies.tolist()],
                    }
                )
    return {"completions": completions}


def statistics_of(completions: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list[float]]]:
    """Per statistic of :data:`STATISTICS`, per kind: the value of every completion."""
    return {
        name: {
            kind: [statistic(name, x["logps"], x["entropies"]) for x in items] for kind, items in completions.items()
        }
        for name in STATISTICS
    }


def markdown(report: dict[str, Any]) -> list[str]:
    """The result page."""
    lines = [
        "# What the plausibility check sees under the default model: own completions, payloads, adaptive attacks",
        "",
        *record_lines(report),
        *(
            [f"Report recomputed from the saved values: `{report['report_command']}`  "]
            if "report_command" in report
            else []
        ),
        f"Setup: {report['setup']}",
        "",
        "Kinds: `own` sampled from the model as a node samples (temperature 1, top_k 0); `own-t0.7`/`own-t1.3` the "
        "same model at another temperature (honest peers set up differently); `payload` the hand-written payload "
        "completions (testbed/payload_attack.py); `terse` short answers in another style; `adaptive` / "
        "`adaptive-format` the adaptive attacker's payload-carrying completions (testbed/adaptive_attack.py: the "
        "policy's own samples, a payload of one word to a short sentence spliced in, the policy's text after it "
        "sampled given the payload, the correct answer in the node's format; `adaptive-format` ends with the answer).",
    ]
    values = statistics_of(report["completions"])
    for name, help_text in STATISTICS.items():
        lines += ["", f"## `{name}`: {help_text}", "", "| completions | n | min | 5th percentile | median | max |"]
        lines.append("|---|---|---|---|---|---|")
        q = {kind: quantiles(v) for kind, v in values[name].items()}
        for kind in KINDS:
            row = q[kind]
            lines.append(
                f"| {kind} | {row['n']} | {row['min']:.2f} | {row['p5']:.2f} | {row['median']:.2f} | {row['max']:.2f} |"
            )
        lines += [
            "",
            "Share of each kind a margin drops (threshold: the own 5th percentile minus the margin; a group of 4 is "
            "dropped if one completion is below: an honest group of 4 own-like completions with probability "
            "1 - (1 - own)^4):",
            "",
            "| margin | threshold | " + " | ".join(KINDS) + " | own group of 4 | own-t1.3 group of 4 |",
            "|---" * (len(KINDS) + 4) + "|",
        ]
        for margin in MARGINS:
            threshold = q["own"]["p5"] - margin
            share = {kind: sum(x < threshold for x in v) / len(v) for kind, v in values[name].items()}
            lines.append(
                f"| {margin:g} | {threshold:.2f} | " + " | ".join(f"{share[k]:.1%}" for k in KINDS)
                + f" | {1 - (1 - share['own']) ** 4:.1%} | {1 - (1 - share['own-t1.3']) ** 4:.1%} |"
            )  # fmt: skip
    lines += ["", *defaults_table(values)]
    lines += [
        "",
        "Values are in nats per token: log-probability plus the policy's entropy at that token, averaged as the "
        "statistic says (about 0 for what the policy samples itself).",
    ]
    return lines


def defaults_table(values: dict[str, dict[str, list[float]]]) -> list[str]:
    """What the check drops with SAPOConfig's defaults, by its mean test alone (the defaults before issue 23) and
    with the worst-span test beside it: per completion, and per group (4 completions of an honest kind; the 2
    payload-carrying completions of an attack group, either of which drops it)."""
    from sapo.config import SAPOConfig

    fields = SAPOConfig.__dataclass_fields__
    margin, span_margin = fields["plausibility_margin"].default, fields["plausibility_span_margin"].default
    span = f"span{fields['plausibility_span_tokens'].default}"
    mean_threshold = quantiles(values["mean"]["own"])["p5"] - margin
    span_threshold = quantiles(values[span]["own"])["p5"] - span_margin
    lines = [
        f"## The defaults: mean test (margin {margin:g}) alone, and with the worst-span test ({span}, margin "
        f"{span_margin:g}) beside it",
        "",
        f"Thresholds: mean {mean_threshold:.2f}, {span} {span_threshold:.2f} nats per token (own 5th percentile minus "
        "the margin). A group is dropped if one completion is: an honest group of 4 with probability 1 - (1 - p)^4, "
        "an attack group (2 payload-carrying completions) with 1 - (1 - p)^2.",
        "",
        "| completions | n | dropped by the mean test | group dropped | dropped by the defaults | group dropped |",
        "|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        means, spans = values["mean"][kind], values[span][kind]
        by_mean = sum(m < mean_threshold for m in means) / len(means)
        both = sum(m < mean_threshold or s < span_threshold for m, s in zip(means, spans, strict=True)) / len(means)
        size = 4 if kind in HONEST_KINDS or kind == "terse" else 2
        lines.append(
            f"| {kind} | {len(means)} | {by_mean:.1%} | {1 - (1 - by_mean) ** size:.1%} | {both:.1%} "
            f"| {1 - (1 - both) ** size:.1%} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure and write the report."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.plausibility_scores", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--questions", type=int, default=12, help="held-out questions of the default tasks")
    parser.add_argument("--samples", type=int, default=4, help="own completions sampled per question and temperature")
    parser.add_argument("--max-tokens", type=int, default=48, help="completion tokens (the node's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument("--report-only", action="store_true", help="recompute the report from the saved JSON")
    args = parser.parse_args(argv)
    if args.report_only:
        previous = json.loads((Path(args.results_dir) / "plausibility_scores.json").read_text())
        report = {**previous, "report_command": run_record()["command"]}
    else:
        report = {
            **run_record(),
            "setup": f"base SmolLM2-135M-Instruct, {args.questions} held-out questions of the default tasks, "
            f"{args.samples} own samples per question and temperature ({args.max_tokens} tokens), 2 completions per "
            f"question of each other kind, seed {args.seed}",
            **measure(args.questions, args.samples, args.max_tokens, args.seed),
        }
    write_report(Path(args.results_dir), "plausibility_scores", report, markdown(report))
    print("\n".join(markdown(report)))
    return report


if __name__ == "__main__":
    main()
