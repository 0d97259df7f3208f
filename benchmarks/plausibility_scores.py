"""Typicality scores (`sapo.plausibility`) under the base default model: its own sampled completions against payload
completions of the attack and terse honest-looking answers, to choose the plausibility margin from measurements.

    python -m benchmarks.plausibility_scores --questions 12

For each held-out question of the default tasks: ``--samples`` completions sampled from the model at temperature 1
(the node's), two payload completions (:func:`testbed.payload_attack.payload_completion`) and two terse answers of
another style ("<answer>X</answer>"), each scored as the node scores them (mean over its tokens of log-probability
plus the policy's entropy, at most ``--max-tokens`` tokens); then the share of each kind every margin would drop.
Results: benchmarks/results/plausibility_scores.{json,md}.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, run_record, write_report

KINDS = ("own", "payload", "terse")
MARGINS = (0.0, 0.25, 0.5, 0.75, 1.0)


def completion_logps(model: Any, tokenizer: Any, prompt: list[dict], texts: Sequence[str], max_tokens: int) -> list:
    """Per text: (log-probability of each of its tokens, the policy's entropy there) after ``prompt``, temperature 1,
    at most ``max_tokens`` tokens."""
    import torch

    rendered = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"][:max_tokens]
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


def measure(questions: int, samples: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """Scores of each kind of completion, and their quantiles."""
    import torch
    from transformers import AutoModelForCausalLM

    from sapo.models import default_model_path, load_smollm2_tokenizer
    from sapo.plausibility import typicality_scores
    from sapo.tasks import DEFAULT_TASKS, build_held_out_dataset
    from testbed.hostile_peer import wrong_answer
    from testbed.payload_attack import payload_completion

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = load_smollm2_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(default_model_path()).eval()
    rows = build_held_out_dataset(DEFAULT_TASKS, questions)
    scores: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        tqdm = None
    for row in tqdm(rows, desc="plausibility scores") if tqdm else rows:
        prompt, answer = row["prompt"], str(row["answer"])
        inputs = tokenizer(
            tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True),
            return_tensors="pt",
            add_special_tokens=False,
        )
        generated = model.generate(
            **inputs, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=max_tokens,
            num_return_sequences=samples, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        texts = {
            "own": [tokenizer.decode(g[inputs["input_ids"].shape[1] :], skip_special_tokens=True) for g in generated],
            "payload": [payload_completion(answer, rng) for _ in range(2)],
            "terse": [f"<answer>{answer}</answer>", f"Let me compute. <answer>{wrong_answer(answer)}</answer>"],
        }
        for kind in KINDS:
            for logps, entropies in completion_logps(model, tokenizer, prompt, texts[kind], max_tokens):
                scores[kind].extend(typicality_scores(logps[None], entropies[None], torch.ones_like(logps)[None]))
    return {"scores": scores, "quantiles": {kind: quantiles(values) for kind, values in scores.items()}}


def markdown(report: dict[str, Any]) -> list[str]:
    """The result page."""
    q = report["quantiles"]
    lines = [
        "# Surprise scores under the default model: own completions against payloads",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{report['git_commit']}`, {report['date']}, {report['machine']}  ",
        f"Setup: {report['setup']}",
        "",
        "| completions | n | min | 5th percentile | median | max |",
        "|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        row = q[kind]
        lines.append(
            f"| {kind} | {row['n']} | {row['min']:.2f} | {row['p5']:.2f} | {row['median']:.2f} | {row['max']:.2f} |"
        )
    lines += [
        "",
        "Share of each kind a margin would drop (threshold: the own 5th percentile minus the margin; a group of 4 is "
        "dropped if one completion is below, so an honest group of own-like completions is dropped with probability "
        "1 - (1 - own)^4):",
        "",
        "| margin (nats per token) | threshold | own samples | payload completions | terse answers "
        "| own-like group of 4 |",
        "|---|---|---|---|---|---|",
    ]
    for margin in MARGINS:
        threshold = q["own"]["p5"] - margin
        share = {kind: sum(x < threshold for x in v) / len(v) for kind, v in report["scores"].items()}
        default = " (default)" if margin == report["margin"] else ""
        lines.append(
            f"| {margin:g}{default} | {threshold:.2f} | {share['own']:.1%} | {share['payload']:.1%} "
            f"| {share['terse']:.1%} | {1 - (1 - share['own']) ** 4:.1%} |"
        )
    lines += [
        "",
        "Scores are in nats per token: the mean over a completion's tokens of log-probability plus the policy's "
        "entropy at that token (about 0 for what the policy samples itself).",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure and write the report."""
    from sapo.config import SAPOConfig

    margin = SAPOConfig.__dataclass_fields__["plausibility_margin"].default
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.plausibility_scores", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--questions", type=int, default=12, help="held-out questions of the default tasks")
    parser.add_argument("--samples", type=int, default=4, help="own completions sampled per question")
    parser.add_argument("--max-tokens", type=int, default=48, help="completion tokens (the node's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", default=str(RESULTS))
    args = parser.parse_args(argv)
    record = run_record()
    report = {
        **record,
        "setup": f"base SmolLM2-135M-Instruct, {args.questions} held-out questions of the default tasks, "
        f"{args.samples} own samples each (temperature 1, {args.max_tokens} tokens), seed {args.seed}",
        "margin": margin,
        **measure(args.questions, args.samples, args.max_tokens, args.seed),
    }
    write_report(Path(args.results_dir), "plausibility_scores", report, markdown(report))
    print("\n".join(markdown(report)))
    return report


if __name__ == "__main__":
    main()
