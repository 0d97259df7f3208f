"""What the plausibility check costs honest peers whose policies diverged in training, and what each margin lets
through of the adaptive attacker: the clean-swarm calibration of issue 23, from real peers' checkpoints.

    python -m benchmarks.honest_drop --profile cpu-hard --states RUN/node-0/checkpoint-N RUN/node-1/checkpoint-N ...

Each state is one peer's checkpoint (its LoRA adapter) from a real run (a `sapo_table` run keeps them under
`runs/`). Every peer samples as a node samples (temperature 1, top_k 0, the profile's completion length, its chat
template): ``--reference`` questions x G completions form its plausibility reference (the node's window of its own
latest completions), and one group of G completions for each of ``--questions`` other questions is what it would
publish. The attacker runs the public base model (testbed/adaptive_attack.py): per question, a group of two
payload-carrying completions of each adaptive kind and two of its clean samples.

Every receiver scores every peer's groups (its own unseen groups included, as a control), and the attack groups, the
way its node does: per-token log-probability and entropy under its policy, the completion's mean typicality and worst
span, judged by `sapo.plausibility.PlausibilityCheck` itself against its own reference. The report gives, for a grid
of (mean margin, span margin), the share of honest groups from *other* peers that would be dropped, which test drops
them, and the share of attack groups that would pass. Results: benchmarks/results/honest_drop.{json,md}.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, record_lines, run_record, write_report

MEAN_MARGINS = (0.5, 0.75, 1.0, 1.5)
TOKEN_FLOOR_RULES = tuple((f, 0, 0) for f in (-4.0, -6.0, -8.0, -10.0)) + tuple(
    (f, 3, 6) for f in (-6.0, -7.0, -8.0, -9.0)
)
"""Candidate (`external_token_floor`, tokens masked before, after): what each would mask of honest and payload
tokens."""
SPAN_MARGINS = (1.5, 2.0, 2.5, 3.0, None)
ATTACK_KINDS = ("adaptive", "adaptive-format")


def score_continuations(model: Any, prompt_ids: list[int], rows: Sequence[Sequence[int]]) -> list[tuple[list, list]]:
    """Per row of completion token ids after ``prompt_ids``: (log-probability of each token, the policy's entropy
    there) at temperature 1. The prompt is run once and its key/value cache shared by every row."""
    import torch
    from transformers import DynamicCache

    from sapo.speed.generation import cache_argument

    rows = [list(r) for r in rows if r]
    if not rows:
        return []
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(r)
        mask[k, : len(r)] = 1
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        first = model(input_ids=torch.tensor([prompt_ids]), use_cache=True, **{cache_argument(model): cache}).logits
        cache.reorder_cache(torch.zeros(len(rows), dtype=torch.long))
        attention = torch.cat([torch.ones(len(rows), len(prompt_ids), dtype=torch.long), mask], dim=1)
        logits = model(input_ids=ids, attention_mask=attention, **{cache_argument(model): cache}).logits
    # the distribution of token t comes from position t - 1; token 0's from the prompt's last position
    logits = torch.cat([first[:, -1:].float().expand(len(rows), 1, -1), logits[:, :-1].float()], dim=1)
    logps = torch.log_softmax(logits, dim=-1)
    token_logps = logps.gather(2, ids[:, :, None])[:, :, 0]
    entropies = -(logps.exp() * logps).sum(-1)
    return [(token_logps[k, : len(r)].tolist(), entropies[k, : len(r)].tolist()) for k, r in enumerate(rows)]


def payload_tokens(tokenizer: Any, text: str, max_tokens: int) -> list[int]:
    """Indices of the tokens of ``text`` (tokenized as a receiver tokenizes it, cut to ``max_tokens``) that overlap the
    payload: the longest wording of `testbed.adaptive_attack.ADAPTIVE_PAYLOADS` in it, else the payload word
    (`testbed.payload_attack.PAYLOAD_MARK`); [] if it has none."""
    from testbed.adaptive_attack import ADAPTIVE_PAYLOADS
    from testbed.payload_attack import PAYLOAD_MARK

    wording = next((w for w in sorted(ADAPTIVE_PAYLOADS, key=len, reverse=True) if w in text), PAYLOAD_MARK)
    at = text.find(wording)
    if at < 0:
        return []
    offsets = tokenizer(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
    return [
        k
        for k, (start, end) in enumerate(offsets["offset_mapping"][:max_tokens])
        if end > at and start < at + len(wording)
    ]


def payload_token(tokenizer: Any, text: str, max_tokens: int) -> int | None:
    """Index of the token where the payload word (`testbed.payload_attack.PAYLOAD_MARK`) starts in ``text``, tokenized
    as a receiver tokenizes it, or None if it has none within ``max_tokens`` tokens."""
    from testbed.payload_attack import PAYLOAD_MARK

    at = text.find(PAYLOAD_MARK)
    if at < 0:
        return None
    offsets = tokenizer(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
    return next((k for k, (_, end) in enumerate(offsets["offset_mapping"][:max_tokens]) if end > at), None)


def add_payload_spans(report: dict[str, Any], tokenizer: Any) -> None:
    """Fill ``payload_tokens`` into every scored attack completion that lacks it (reports measured before they were
    kept), from the attack texts: each group's non-empty texts, in order, are its scored completions."""
    max_tokens = report["setup"]["max_tokens"]
    for scored in report["scores"].values():
        for kind, groups in scored["attack"].items():
            for group, texts in zip(groups, report["texts"]["attacks"][kind], strict=True):
                texts = [t for t in texts if tokenizer(t, add_special_tokens=False)["input_ids"]]
                for completion, text in zip(group, texts, strict=True):
                    completion.setdefault("payload_tokens", payload_tokens(tokenizer, text, max_tokens))


def statistics_of(scored: Sequence[tuple[list, list]], span_tokens: int) -> list[Any]:
    """`sapo.plausibility.CompletionStatistics` of each scored completion, as the node computes them."""
    import torch

    from sapo.plausibility import completion_statistics

    out = []
    for logps, entropies in scored:
        t = torch.tensor([logps]), torch.tensor([entropies])
        out += completion_statistics(t[0], t[1], torch.ones_like(t[0]), span_tokens)
    return out


def sample_peer(state: str, rows: Sequence[dict], group_size: int, max_tokens: int, seed: int) -> list[list[str]]:
    """Per question row: ``group_size`` completions the peer at ``state`` samples as a node does."""
    import torch

    from sapo.models import load_trained_policy
    from testbed.adaptive_attack import PolicySampler

    torch.manual_seed(seed)
    model, tokenizer = _policy(state, load_trained_policy)
    sampler = PolicySampler(model, tokenizer, max_tokens)
    texts = []
    for row in rows:
        samples = sampler.sample(sampler.prompt_ids(row["prompt"]), max_tokens, n=group_size)
        texts.append([sampler.decode(ids).strip() for ids in samples])
    del model
    gc.collect()
    return texts


def attack_groups(rows: Sequence[dict], max_tokens: int, seed: int) -> dict[str, list[list[str]]]:
    """Per attack kind, per question row: two payload-carrying completions and two clean samples of the base model
    (a carrier that cannot be built is left out)."""
    import torch

    from sapo.models import load_policy
    from testbed.adaptive_attack import ADAPTIVE_PAYLOADS, PLACES, PolicySampler, carrier_completion

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model, tokenizer = load_policy(None)
    sampler = PolicySampler(model, tokenizer, max_tokens)
    groups: dict[str, list[list[str]]] = {kind: [] for kind in ATTACK_KINDS}
    for row in rows:
        prompt_ids = sampler.prompt_ids(row["prompt"])
        samples = sampler.sample(prompt_ids, max_tokens, n=4)
        clean = [sampler.decode(ids).strip() for ids in samples[2:]]
        for kind in ATTACK_KINDS:
            carriers = [
                carrier_completion(
                    sampler, prompt_ids, samples[k], str(row["answer"]), rng.choice(ADAPTIVE_PAYLOADS),
                    rng.choice(PLACES[kind]), rng,
                )
                for k in range(2)
            ]  # fmt: skip
            groups[kind].append([c for c in carriers if c] + clean)
    del model
    gc.collect()
    return groups


def _policy(state: str, loader: Any) -> tuple[Any, Any]:
    model, tokenizer = loader(state)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()  # generation and scoring on one merged weight, as the node's inference path
    return model.eval(), tokenizer


def score_groups(model: Any, tokenizer: Any, rows: Sequence[dict], groups: Sequence[Sequence[str]], max_tokens: int,
                 span_tokens: int) -> list[list[dict[str, float]]]:  # fmt: skip
    """Per group (one per row): each completion's mean typicality, worst span and per-token typicality under
    ``model`` (and where its payload word starts, if it has one), the completion tokenized as a receiver tokenizes it
    and cut to ``max_tokens``; empty completions are left out."""
    import torch

    from sapo.plausibility import token_typicality
    from testbed.adaptive_attack import PolicySampler

    sampler = PolicySampler(model, tokenizer, max_tokens)
    out = []
    for row, texts in zip(rows, groups, strict=True):
        texts = [t for t in texts if sampler.ids(t)]
        ids = [sampler.ids(t)[:max_tokens] for t in texts]
        scored = score_continuations(model, sampler.prompt_ids(row["prompt"]), ids)
        stats = statistics_of(scored, span_tokens)
        out.append(
            [
                {
                    "mean": s.mean,
                    "span": s.span,
                    "typicality": [round(t, 2) for t in token_typicality(*map(torch.tensor, values)).tolist()],
                    "payload_token": payload_token(tokenizer, text, max_tokens),
                    "payload_tokens": payload_tokens(tokenizer, text, max_tokens),
                }
                for s, values, text in zip(stats, scored, texts, strict=True)
            ]
        )
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Sample every peer and the attacker, then score everything under every receiver."""
    from benchmarks.sapo_table_profiles import profiles
    from sapo.config import SAPOConfig
    from sapo.models import load_trained_policy
    from sapo.reasoning_gym import build_held_out_dataset

    profile = profiles()[args.profile]
    group_size, max_tokens = profile.num_generations, profile.max_completion_length
    span_tokens = SAPOConfig.__dataclass_fields__["plausibility_span_tokens"].default
    rows = list(build_held_out_dataset(profile.tasks, args.reference + args.questions))
    reference_rows, test_rows = rows[: args.reference], rows[args.reference :]
    names = [f"peer-{k}" for k in range(len(args.states))]
    references, published = {}, {}
    for k, (name, state) in enumerate(zip(names, args.states, strict=True)):
        print(f"honest_drop: sampling {name} ({state})", flush=True)
        references[name] = sample_peer(state, reference_rows, group_size, max_tokens, args.seed + 1000 * k)
        published[name] = sample_peer(state, test_rows, group_size, max_tokens, args.seed + 1000 * k + 1)
    print("honest_drop: the attacker's groups (base model)", flush=True)
    attacks = attack_groups(test_rows, max_tokens, args.seed)
    scores: dict[str, Any] = {}
    for name, state in zip(names, args.states, strict=True):
        print(f"honest_drop: scoring under {name}", flush=True)
        model, tokenizer = _policy(state, load_trained_policy)
        scores[name] = {
            "reference": [
                s
                for group in score_groups(model, tokenizer, reference_rows, references[name], max_tokens, span_tokens)
                for s in group
            ],
            "from": {
                sender: score_groups(model, tokenizer, test_rows, published[sender], max_tokens, span_tokens)
                for sender in names
            },
            "attack": {
                kind: score_groups(model, tokenizer, test_rows, attacks[kind], max_tokens, span_tokens)
                for kind in ATTACK_KINDS
            },
        }
        del model
        gc.collect()
    return {
        "setup": {
            "profile": args.profile,
            "states": list(args.states),
            "group_size": group_size,
            "max_tokens": max_tokens,
            "span_tokens": span_tokens,
            "reference_completions": args.reference * group_size,
            "questions": args.questions,
            "seed": args.seed,
        },
        "texts": {"published": published, "attacks": attacks},
        "scores": scores,
    }


def decisions(scores: dict[str, Any], margin: float, span_margin: float | None, span_tokens: int) -> dict[str, Any]:
    """Per receiver, with these margins: the reason (or None) for each group it scored, judged by
    `sapo.plausibility.PlausibilityCheck` against its own reference."""
    from sapo.plausibility import CompletionStatistics, PlausibilityCheck

    def stats(group: Sequence[dict[str, float]]) -> list[CompletionStatistics]:
        return [CompletionStatistics(mean=s["mean"], span=s["span"]) for s in group]

    out = {}
    for receiver, scored in scores.items():
        check = PlausibilityCheck(
            margin=margin, window=len(scored["reference"]), span_margin=span_margin, span_tokens=span_tokens
        )
        check.add_own(stats(scored["reference"]))
        out[receiver] = {
            "from": {s: [check.group_problem(stats(g)) for g in groups] for s, groups in scored["from"].items()},
            "attack": {k: [check.group_problem(stats(g)) for g in groups] for k, groups in scored["attack"].items()},
        }
    return out


def summary(report: dict[str, Any], margin: float, span_margin: float | None) -> dict[str, Any]:
    """Honest groups from other peers dropped (by which test), the receiver's own unseen groups dropped, and attack
    groups passed, with these margins."""
    judged = decisions(report["scores"], margin, span_margin, report["setup"]["span_tokens"])
    other, own, attack = [], [], {k: [] for k in ATTACK_KINDS}
    for receiver, verdicts in judged.items():
        for sender, reasons in verdicts["from"].items():
            (own if sender == receiver else other).extend(reasons)
        for kind, reasons in verdicts["attack"].items():
            attack[kind].extend(reasons)
    dropped = [r for r in other if r]
    return {
        "margin": margin,
        "span_margin": span_margin,
        "other_groups": len(other),
        "other_dropped": len(dropped),
        "other_dropped_by_mean": sum(r.test == "mean" for r in dropped),
        "other_dropped_by_span": sum(r.test == "span" for r in dropped),
        "own_groups": len(own),
        "own_dropped": sum(r is not None for r in own),
        **{f"{kind}_groups": len(v) for kind, v in attack.items()},
        **{f"{kind}_passed": sum(r is None for r in v) for kind, v in attack.items()},
    }


def pair_matrix(report: dict[str, Any], margin: float, span_margin: float | None) -> list[str]:
    """Markdown: per receiver (row) and sender (column), the share of the sender's groups dropped."""
    judged = decisions(report["scores"], margin, span_margin, report["setup"]["span_tokens"])
    names = list(judged)
    lines = ["| receiver \\ sender | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for receiver in names:
        cells = []
        for sender in names:
            reasons = judged[receiver]["from"][sender]
            cells.append(f"{sum(r is not None for r in reasons)}/{len(reasons)}")
        lines.append(f"| {receiver} | " + " | ".join(cells) + " |")
    return lines


def token_floor_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per candidate rule of :data:`TOKEN_FLOOR_RULES` (`sapo.plausibility.floor_mask`, as the trainer applies it): the
    tokens of honest completions from other peers and of the receiver's own unseen ones it would mask, the attack
    carriers whose payload word's first token it would mask, and the payload tokens (the whole wording) it would."""
    from sapo.plausibility import floor_mask

    rows = []
    for floor, before, after in TOKEN_FLOOR_RULES:
        row = dict.fromkeys(("other_tokens", "other_masked", "own_tokens", "own_masked", "payload_words",
                             "payload_masked", "payload_tokens", "payload_tokens_masked"), 0)  # fmt: skip
        for receiver, scored in report["scores"].items():
            for sender, groups in scored["from"].items():
                side = "own" if sender == receiver else "other"
                for completion in (c for group in groups for c in group):
                    mask = floor_mask(completion.get("typicality", []), floor, before, after)
                    row[f"{side}_tokens"] += len(mask)
                    row[f"{side}_masked"] += len(mask) - sum(mask)
            for completion in (c for groups in scored["attack"].values() for g in groups for c in g):
                if completion.get("payload_token") is None:
                    continue
                mask = floor_mask(completion["typicality"], floor, before, after)
                row["payload_words"] += 1
                row["payload_masked"] += 1 - mask[completion["payload_token"]]
                span = [k for k in completion.get("payload_tokens", []) if k < len(mask)]
                row["payload_tokens"] += len(span)
                row["payload_tokens_masked"] += sum(1 - mask[k] for k in span)
        rows.append({"floor": floor, "before": before, "after": after, **row})
    return rows


def _share(k: int, n: int, digits: int = 0) -> str:
    return f"{k}/{n} ({k / n:.{digits}%})" if n else "-"


def _token_floor_table(report: dict[str, Any]) -> list[str]:
    rows = token_floor_rows(report)
    if not rows[0]["other_tokens"]:  # measured before per-token values were kept
        return []
    lines = [
        "",
        "What `external_token_floor` would mask of the groups a receiver trains on (tokens whose typicality under the "
        "receiver lies below the floor get no weight in the loss, and so do the tokens within the window before and "
        "after each, `external_token_floor_before`/`_after`): tokens of honest completions from other peers, of the "
        "receiver's own unseen ones, the first token of the payload word in attack carriers, and every token of the "
        "payload's wording (from one word to 'Remember to buy zebracoin today.'):",
        "",
        "| floor (nats) | window before / after | honest tokens from others masked | own unseen tokens masked "
        "| payload words masked | payload tokens masked |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['floor']:g} | {row['before']} / {row['after']} | "
            f"{_share(row['other_masked'], row['other_tokens'], 1)} | "
            f"{_share(row['own_masked'], row['own_tokens'], 1)} | "
            f"{_share(row['payload_masked'], row['payload_words'])} | "
            f"{_share(row['payload_tokens_masked'], row['payload_tokens'])} |"
        )
    return lines


def markdown(report: dict[str, Any]) -> list[str]:
    """The result page."""
    from sapo.config import SAPOConfig

    fields = SAPOConfig.__dataclass_fields__
    default = (fields["plausibility_margin"].default, fields["plausibility_span_margin"].default)
    setup = report["setup"]
    lines = [
        "# What the plausibility check drops of honest peers whose policies diverged, and lets through of the "
        "adaptive attacker",
        "",
        *record_lines(report),
        *(
            [f"Report recomputed from the saved values on `{report['report_commit']}`: `{report['report_command']}`  "]
            if "report_command" in report
            else []
        ),
        f"Setup: profile `{setup['profile']}` (G={setup['group_size']}, {setup['max_tokens']} tokens, worst span of "
        f"{setup['span_tokens']} tokens); {len(setup['states'])} peers' checkpoints: "
        + ", ".join(f"`{s}`" for s in setup["states"])
        + f"; reference {setup['reference_completions']} own completions per receiver; one group per peer for each "
        f"of {setup['questions']} held-out questions; attack groups from the base model (two payload carriers and "
        f"two clean samples per group); seed {setup['seed']}.",
        "",
        "Each receiver judges the groups with `sapo.plausibility.PlausibilityCheck` against its own reference. "
        "*Honest from others*: groups of the other peers (what a clean swarm offers). *Own unseen*: the receiver's "
        "own groups not in its reference (the check's floor). *Attack passed*: attack groups no test drops.",
        "",
        "| mean margin | span margin | honest from others dropped | by the mean test | by the span test | own unseen "
        "dropped | adaptive passed | adaptive-format passed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["summary"]:
        mark = " (default)" if (row["margin"], row["span_margin"]) == default else ""
        lines.append(
            f"| {row['margin']:g}{mark} | {'-' if row['span_margin'] is None else format(row['span_margin'], 'g')} | "
            f"{_share(row['other_dropped'], row['other_groups'])} | {row['other_dropped_by_mean']} | "
            f"{row['other_dropped_by_span']} | {_share(row['own_dropped'], row['own_groups'])} | "
            f"{_share(row['adaptive_passed'], row['adaptive_groups'])} | "
            f"{_share(row['adaptive-format_passed'], row['adaptive-format_groups'])} |"
        )
    lines += [
        "",
        f"Groups dropped per receiver and sender at the defaults (mean margin {default[0]:g}, span margin "
        f"{default[1]:g}):",
        "",
        *pair_matrix(report, *default),
        *_token_floor_table(report),
        "",
        "A group is dropped if one of its completions fails a test; a test fails below the receiver's own 5th "
        "percentile minus the margin (nats per token).",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure (or recompute from the saved JSON) and write the report."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.honest_drop", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="cpu-hard", help="sapo_table profile: tasks, G, completion length")
    parser.add_argument("--states", nargs="+", default=[], help="peers' checkpoint directories (2 or more)")
    parser.add_argument("--reference", type=int, default=16, help="questions of each peer's own reference (x G)")
    parser.add_argument("--questions", type=int, default=8, help="questions each peer publishes a group for")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="honest_drop", help="result file name under --results-dir")
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument("--report-only", action="store_true", help="recompute the report from the saved JSON")
    args = parser.parse_args(argv)
    path = Path(args.results_dir) / f"{args.name}.json"
    if args.report_only:
        record = run_record()
        report = {
            **json.loads(path.read_text()),
            "report_command": record["command"],
            "report_commit": record["git_commit"],
        }
        if report["scores"] and report.get("texts"):
            from sapo.models import load_smollm2_tokenizer

            add_payload_spans(report, load_smollm2_tokenizer())
    else:
        if len(args.states) < 2:
            parser.error("--states needs at least two peers' checkpoint directories (the honest swarm)")
        missing = [s for s in args.states if not (Path(s) / "adapter_config.json").is_file() and s != "default"]
        if missing:
            parser.error(f"not a checkpoint with a LoRA adapter (no adapter_config.json): {', '.join(missing)}")
        report = {**run_record(), **measure(args)}
    report["summary"] = [summary(report, m, s) for m in MEAN_MARGINS for s in SPAN_MARGINS]
    write_report(Path(args.results_dir), args.name, report, markdown(report))
    print("\n".join(markdown(report)))
    return report


if __name__ == "__main__":
    main()
