"""What one sender naming a new costly reasoning-gym config in every group makes a node spend, with and without rests;
with ``--fresh-identities``, what a peer spends sending each such group under a new identity; with ``--slow-answers``,
what one sender of answers that keep the default reward at its scoring deadline makes it spend.

A receiver (a tiny SAPOTrainer over an in-memory swarm, so that only the intake's cost is measured) trains beside an
honest sender (one group of the receiver's own config a round) and a costly one, which publishes each round
``--costly-groups`` groups of `rubiks_cube` configs of 2 million scramble moves (minutes to regenerate), each config
new, so none is ever remembered as past a limit. At the node's defaults (`regeneration_timeout` 10 s,
`regeneration_budget` 30 s) each costly group costs a whole timeout until the round's budget is spent. Three arms:
the node's rests at their defaults (`sender_rederivation_seconds` and `newcomer_rederivation_seconds`, 15 s each: a
sender never judged good spends the newcomers' shared rest too), the sender's own rest alone, and no rest. With
``--fresh-identities``
each costly group comes from an identity never seen before, so no sender's own rest is ever reached; the arms then
differ in `newcomer_rederivation_seconds` (the newcomers' shared rest): its default (15 s), and None. Steps are paced to
``--pace`` seconds (a sleep after a shorter step), as a node on the default model takes 10-18 s a step on a CPU, so
that a rest decays in the time it would in a node. Per step: the intake's re-derivation time
(`sapo/time/external_scoring`) and whether the honest group was taken.

With ``--slow-answers`` the receiver trains on `simple_integration` with the default reward (`reasoning_gym_reward`),
and the slow sender's groups are of the receiver's own config, each answer a power of a sum whose check (sympy's
``simplify`` of its derivative) takes most of the 1 s scoring deadline (``SLOW_POWER``, a new constant in every
group, so sympy's cache never answers); the arms differ in `sender_rederivation_seconds`, which scoring beyond what is
free is charged to:

    python -m benchmarks.rederivation_stall
    python -m benchmarks.rederivation_stall --fresh-identities
    python -m benchmarks.rederivation_stall --slow-answers

Writes ``rederivation_stall.{json,md}`` (``_fresh_identities``, ``_slow_answers``) into ``--output-dir`` (default
benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, record_lines, run_record, summary, write_report

COSTLY_MOVES = 2_000_000
"""Scramble moves of the costly configs: minutes to regenerate, so every one runs to its limit."""

SLOW_POWER = 7
"""The power of ``(x+a+b+c+d+N)``, a new ``N`` in every group, that the slow sender answers with: the integration
scorer's check of one such answer takes about half the 1 s deadline (benchmarks/README.md)."""

ARMS = {
    "slow answers": {
        "rest (default, 15 s)": {"sender_rederivation_seconds": 15.0},
        "no rest": {"sender_rederivation_seconds": None},
    },
    "one sender": {
        "rests (defaults, 15 s)": {"sender_rederivation_seconds": 15.0, "newcomer_rederivation_seconds": 15.0},
        "the sender's rest alone": {"sender_rederivation_seconds": 15.0, "newcomer_rederivation_seconds": None},
        "no rest": {"sender_rederivation_seconds": None, "newcomer_rederivation_seconds": None},
    },
    "fresh identities": {
        "newcomers' rest (default, 15 s)": {"newcomer_rederivation_seconds": 15.0},
        "no newcomers' rest": {"newcomer_rederivation_seconds": None},
    },
}
"""The arms of each attack: the options in which they differ (the others at the node's defaults)."""


def run_arm(
    options: dict[str, Any], attack: str, steps: int, costly_groups: int, pace: float, work: Path
) -> list[dict[str, Any]]:
    """One arm's per-step records: ``external_scoring`` seconds, ``honest_taken`` and the costly groups' drops."""
    from transformers import PrinterCallback, TrainerCallback

    from rewards import reasoning_gym_reward
    from sapo.models import load_smollm2_tokenizer
    from sapo.tasks import TaskSpec, build_reasoning_gym_dataset
    from swarm import Group, MemorySwarm, Provenance
    from swarm.records import provenance_from_wire
    from testbed.tiny_run import tiny_trainer

    slow_answers = attack == "slow answers"
    task = (
        TaskSpec("simple_integration")
        if slow_answers
        else TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 1})
    )
    rows = build_reasoning_gym_dataset([task], size=64)
    swarm = MemorySwarm(seed=0)
    honest, costly = swarm.join("honest"), swarm.join("costly")
    made = iter(range(10**9))

    def slow_group(row: dict[str, Any], n: int) -> Group:
        """A group of ``row``'s question whose every answer keeps the reward near its deadline."""
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        answers = [f"<answer>(x+a+b+c+d+{n + k})**{SLOW_POWER}</answer>" for k in range(4)]
        return Group(f"s-{n}", [row["prompt"][-1]], answers, provenance, created_at=time.time())

    class Senders(TrainerCallback):
        """Each round: the honest sender's group, the costly sender's groups; each step paced to ``pace``."""

        def on_step_begin(self, args, state, control, **kwargs):
            self.began = time.monotonic()
            row = rows[state.global_step % len(rows)]
            provenance = provenance_from_wire(json.loads(row["provenance"]))
            # right and wrong answers (the gold one where the reward scores answers): rewards with spread, usable
            right = f"<answer>{row['answer']}</answer>" if slow_answers else "1"
            honest.publish([Group(f"h-{state.global_step}", [row["prompt"][-1]], [right, "22", "3", "4"], provenance,
                                  created_at=time.time() - 1)])  # fmt: skip
            if slow_answers:
                costly.publish([slow_group(rows[(state.global_step + 1 + k) % len(rows)], 10 * next(made))
                                for k in range(costly_groups)])  # fmt: skip
                return
            groups = []
            for _ in range(costly_groups):
                moves = COSTLY_MOVES + next(made)
                config = {"min_scramble_steps": moves, "max_scramble_steps": moves}
                provenance = Provenance("reasoning_gym", "rubiks_cube", config, 1, 0)
                group = Group(f"c-{moves}", [{"role": "user", "content": "Solve this cube."}], ["1", "22", "3", "4"],
                              provenance, created_at=time.time())  # fmt: skip
                if attack == "fresh identities":
                    swarm.join(f"new-{moves}").publish([group])
                else:
                    groups.append(group)
            if groups:
                costly.publish(groups)

        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(max(0.0, pace - (time.monotonic() - self.began)))

    def spread(completions, **kw):  # rewards with spread: a usable group is taken
        return [float(k) for k in range(len(completions))]

    reward = reasoning_gym_reward if slow_answers else spread
    if slow_answers:  # room for the slow answer (about 20 tokens): a completion is scored as cut to this length
        options = {**options, "max_completion_length": 32}
    trainer = tiny_trainer(
        work, load_smollm2_tokenizer(), [reward], rows, swarm=swarm.join("me"), callbacks=[Senders()],
        num_local=1, num_external=1, max_steps=steps, external_pool_size=4 * (costly_groups + 1), logging_steps=1,
        plausibility_margin=None, **options,
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # the report says what matters; no dict of metrics a step
    records: list[dict[str, Any]] = []
    seen: dict[str, float] = {}  # the cumulative drop counts at the step before
    trainer.train()
    for entry in trainer.state.log_history:
        if "sapo/time/external_scoring" not in entry:
            continue
        totals = {k: float(v) for k, v in entry.items() if k.startswith("sapo/total/dropped/")}
        step = {
            "step": int(entry["step"]) if "step" in entry else len(records) + 1,
            "external_scoring_s": float(entry["sapo/time/external_scoring"]),
            "external_groups": float(entry.get("sapo/external_groups", 0.0)),
            "limits": totals.get("sapo/total/dropped/regeneration_limit", 0.0) - seen.get("limit", 0.0),
            "budget": totals.get("sapo/total/dropped/regeneration_budget", 0.0) - seen.get("budget", 0.0),
            "rested": totals.get("sapo/total/dropped/rederivation_cost", 0.0) - seen.get("rested", 0.0),
        }
        seen = {
            "limit": totals.get("sapo/total/dropped/regeneration_limit", 0.0),
            "budget": totals.get("sapo/total/dropped/regeneration_budget", 0.0),
            "rested": totals.get("sapo/total/dropped/rederivation_cost", 0.0),
        }
        records.append(step)
    return records


def markdown(arms: dict[str, list[dict[str, Any]]], pace: float) -> list[str]:
    """Per arm: the re-derivation and scoring seconds per step (mean, median, most), honest groups taken, and the
    costly sender's groups by fate; then each arm's steps."""
    lines = [
        "| arm | steps | re-derivation and scoring s/step: mean | median | most | honest groups taken | costly "
        "groups: run to "
        "a limit | cut or refused by the budget | rested (unread) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, steps in arms.items():
        seconds = [s["external_scoring_s"] for s in steps]
        stats = summary(seconds)
        lines.append(
            f"| {arm} | {len(steps)} | {sum(seconds) / len(seconds):.2f} | {stats['median']:.2f} | {max(seconds):.2f} "
            f"| {sum(s['external_groups'] for s in steps):.0f} | {sum(s['limits'] for s in steps):.0f} "
            f"| {sum(s['budget'] for s in steps):.0f} | {sum(s['rested'] for s in steps):.0f} |"
        )
    lines += ["", f"Per step (re-derivation and scoring seconds; steps paced to {pace:g} s):", ""]
    lines.append("| arm | " + " | ".join(str(s["step"]) for s in next(iter(arms.values()))) + " |")
    lines.append("|---|" + "---|" * len(next(iter(arms.values()))))
    for arm, steps in arms.items():
        lines.append(f"| {arm} | " + " | ".join(f"{s['external_scoring_s']:.1f}" for s in steps) + " |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the attack's arms, one after the other, and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per arm (default 20)")
    parser.add_argument("--costly-groups", type=int, default=4, help="the costly sender's groups a round (default 4)")
    parser.add_argument("--pace", type=float, default=12.0, help="seconds a step lasts at least (default 12)")
    parser.add_argument("--fresh-identities", action="store_true", help="send each costly group under a new identity")
    parser.add_argument("--slow-answers", action="store_true", help="send answers slow to score instead of configs")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    record = run_record(" ".join(["python -m benchmarks.rederivation_stall", *(argv or sys.argv[1:])]))
    attack = "slow answers" if args.slow_answers else "fresh identities" if args.fresh_identities else "one sender"
    arms: dict[str, list[dict[str, Any]]] = {}
    for arm, options in ARMS[attack].items():
        print(f"arm {arm}: {args.steps} steps paced to {args.pace:g} s", flush=True)
        with tempfile.TemporaryDirectory(prefix="rederivation-stall-") as work:
            arms[arm] = run_arm(options, attack, args.steps, args.costly_groups, args.pace, Path(work))
    data = {**record, "attack": attack, "steps": args.steps, "costly_groups": args.costly_groups, "pace": args.pace}
    data["arms"] = arms
    if args.slow_answers:
        title = "# What a sender of answers slow to score makes a node spend"
        setup = (
            f"A tiny receiver over an in-memory swarm on `simple_integration` with `reasoning_gym_reward`, one honest "
            f"sender (a group a round) and one that sends {args.costly_groups} groups a round of the receiver's own "
            f"config, whose every answer is `(x+a+b+c+d+N)**{SLOW_POWER}` (a new N each): the integration scorer's "
            "check takes most of the 1 s deadline, which a question's answers share; the arms differ only in "
            "`sender_rederivation_seconds`, which scoring beyond what is free is charged to."
        )
    else:
        sender = (
            f"{args.costly_groups} new identities a round, each sending one group"
            if args.fresh_identities
            else f"one that sends {args.costly_groups} groups a round"
        )
        option = (
            "only in `newcomer_rederivation_seconds`"
            if args.fresh_identities
            else "in `sender_rederivation_seconds` and `newcomer_rederivation_seconds` (the costly sender is never "
            "judged good: both rests are charged its re-derivation)"
        )
        title = "# What a sender of costly configs makes a node spend" + (
            ", each group under a new identity" if args.fresh_identities else ""
        )
        setup = (
            f"A tiny receiver over an in-memory swarm, one honest sender (a group a round) and {sender}, each of a new "
            f"`rubiks_cube` config of {COSTLY_MOVES:,} scramble moves; `regeneration_timeout` 10 s and "
            f"`regeneration_budget` 30 s (the defaults); the arms differ {option}."
        )
    lines = [
        title,
        "",
        *record_lines(record),
        "",
        setup,
        "",
        *markdown(arms, args.pace),
    ]
    name = "rederivation_stall" + (
        "_slow_answers" if args.slow_answers else "_fresh_identities" if args.fresh_identities else ""
    )
    write_report(args.output_dir, name, data, lines)
    print("\n".join(lines))
    return data


if __name__ == "__main__":
    main()
