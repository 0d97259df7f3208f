"""The completion-poisoning attack against honest sapo-nodes: how far a payload spreads, per defence.

Each arm is one swarm on 127.0.0.1: a :class:`~testbed.payload_attack.PayloadAttacker` (the swarm's first peer, a
model-less transport in this process) publishes groups whose correct completions carry a payload, and
``--honest`` real ``sapo-node`` processes train ``--steps`` steps beside it, each keeping every completion it
generates (``--completions_log``). Attack success is the share of an honest node's own completions that carry the
payload word (:data:`testbed.payload_attack.PAYLOAD_MARK`), in training (last third of the steps) and in its
held-out answers at the end, against the same figures at the start. Since a payload spreads into sampled text only
once the policy finds it likely, the report also measures how far each node's final policy moved towards it: the
log-probability per token of the payload sentences after a correct answer on held-out questions, against the base
model's (``payload_log_likelihood``).

    python -m benchmarks.poisoning --arms none,default --seeds 0 --steps 30
    python -m benchmarks.poisoning --attack adaptive-format --arms mean-only,default --honest 1 --steps 15

``--attack`` picks the attacker: ``payload`` (default) writes its completions by hand (:mod:`testbed.payload_attack`);
``adaptive``, ``adaptive-format`` and ``dos`` are built from the victim's public model
(:mod:`testbed.adaptive_attack`): ``--pool-size`` groups sampled once per kind and seed before the arms run (cached
under ``<runs-dir>/pools/``, shared by every arm), then published in turn, each time under a new group id.

Arms name node options (``ARMS``): ``none`` is the node without any completion defence (control characters allowed, no
plausibility check); ``hygiene`` keeps only the default completion hygiene; ``default`` is the node's defaults (hygiene,
the plausibility check's mean and worst-span tests, the token floor that keeps what passes from being learned, and
per-sender standing that benches a peer whose groups keep being dropped); ``previous`` the defaults before the token
floor (margins 0.5 and 1.5, the learning campaign's commit 0e7b344); ``mean-only`` the defaults before issue 23 (the
mean test alone, margin 0.5); ``no-standing`` the defaults without per-sender standing (the defaults of e5070d7);
``clean`` is the node's defaults in a swarm whose first peer publishes nothing, ``clean-previous`` the same with the
previous defaults, and ``clean-none`` the same swarm without the defences: side by side, what the defences cost when
there is no attack (honest groups they drop, reward, held-out pass@1, step time). With ``--honest 1`` a clean arm is the
drift baseline: one node trains on its own groups only, and its payload log-likelihood at the end says how far training
alone moves it. ``floor-alone`` is the token floor of 9a03744 (-6, no window around a masked token). Results go to
benchmarks/results/<--report-name>.{json,md} (default ``poisoning``); per-arm run directories under runs/poisoning/ (not
committed). ``--report-only`` measures the existing run directories again (e.g. with a newer measurement), keeping the
commit the arms ran on from the previous report."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, ROOT, record_lines, run_record, stop_processes, write_report
from sapo.jsonl_files import read_jsonl
from testbed.payload_attack import PAYLOADS, PLACES

ARMS: dict[str, list[str]] = {
    "none": ["--completion_forbid_control_chars", "false", "--plausibility_margin", "none"],
    "hygiene": ["--plausibility_margin", "none"],
    "default": [],
    "floor-alone": [
        "--external_token_floor",
        "-6",
        "--external_token_floor_before",
        "0",
        "--external_token_floor_after",
        "0",
    ],  # fmt: skip
    "previous": ["--plausibility_margin", "0.5", "--plausibility_span_margin", "1.5", "--external_token_floor", "none"],
    "mean-only": [
        "--plausibility_margin",
        "0.5",
        "--plausibility_span_margin",
        "none",
        "--external_token_floor",
        "none",
    ],  # fmt: skip
    "no-standing": ["--sender_drop_limit", "none"],  # the defaults before sender standing was turned on
    "clean": [],
    "clean-previous": [
        "--plausibility_margin",
        "0.5",
        "--plausibility_span_margin",
        "1.5",
        "--external_token_floor",
        "none",
    ],  # fmt: skip
    "clean-none": ["--completion_forbid_control_chars", "false", "--plausibility_margin", "none"],
}
"""Node options of each arm: the defences it turns on or off."""

ATTACK_KINDS = ("payload", "adaptive", "adaptive-format", "dos")
"""What the attacker publishes (``--attack``)."""

ATTACK_FREE_ARMS = {"clean", "clean-none", "clean-previous"}
"""Arms whose first peer (the bootstrap) publishes nothing."""

COMPLETIONS_LOG = "completions.jsonl"


def node_command(args: argparse.Namespace, arm: str, seed: int, index: int, run_dir: Path, peer: str) -> list[str]:
    """The command of honest node ``index`` of one arm's swarm."""
    return [
        sys.executable, "-m", "sapo.node.cli",
        "--model", args.model,
        "--output_dir", str(run_dir / f"node-{index}"),
        "--initial_peers", peer,
        "--swarm_name", f"poisoning-{arm}-{seed}",
        "--wait_for_peers", str(args.honest),  # the other honest nodes and the attacker
        "--max_steps", str(args.steps),
        "--seed", str(100 * seed + index),
        "--completions_log", COMPLETIONS_LOG,
        "--eval_steps", str(args.steps),
        "--eval_questions", str(args.eval_questions),
        "--save_steps", str(args.steps),
        *args.node_args,
        *ARMS[arm],
    ]  # fmt: skip


def run_arm(args: argparse.Namespace, arm: str, seed: int) -> Path:
    """One swarm: the attacker and ``args.honest`` nodes until they finish; returns the run directory."""
    from sapo.node.local_swarm import shared_cores_env
    from sapo.node.warm_start import WarmStarter, start_node_process
    from sapo.tasks import DEFAULT_TASKS
    from swarm.dht import DHTTransport, DHTTransportConfig
    from testbed.payload_attack import PayloadAttacker

    run_dir = Path(args.runs_dir) / arm / f"seed-{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    transport = DHTTransport(
        DHTTransportConfig(swarm_name=f"poisoning-{arm}-{seed}", model_name="attacker", prefetch_groups=1)
    )
    tasks = args.tasks.split(",") if args.tasks else DEFAULT_TASKS
    attacker = PayloadAttacker(
        transport,
        tasks,
        args.attack_interval,
        groups_per_round=2,
        seed=seed,
        payloads=args.payloads,
        places=args.places,
        pool=attack_pool(args, seed),
    )
    env = shared_cores_env(args.honest)
    starter = WarmStarter.shared() or WarmStarter(env)  # the honest nodes' libraries imported once, not per node
    processes: list = []
    try:
        if arm not in ATTACK_FREE_ARMS:
            attacker.start()
        peer = transport.visible_addresses()[0]
        for index in range(args.honest):
            log = open(run_dir / f"node-{index}.out", "w")  # noqa: SIM115 - closed with the process below
            command = node_command(args, arm, seed, index, run_dir, peer)
            processes.append(
                start_node_process(command, starter=starter, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            )
        deadline = time.monotonic() + args.timeout
        while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
            time.sleep(2)
        codes = [p.poll() for p in processes]
        if any(code != 0 for code in codes):
            raise RuntimeError(f"poisoning: arm {arm} seed {seed}: node exit codes {codes}; see {run_dir}/node-*.out")
    finally:
        attacker.stop()
        stop_processes(processes, grace=60)
        starter.close()
        transport.close()
    (run_dir / "attacker.json").write_text(
        json.dumps(
            {
                "published_groups": attacker.published,
                "peer_id": transport.peer_id,
                "attack": args.attack,
                "payloads": list(args.payloads),
                "places": list(args.places),
            }
        )
    )
    return run_dir


def attack_pool(args: argparse.Namespace, seed: int) -> list | None:
    """The adaptive attacker's groups for ``seed`` (None for the hand-written ``payload`` attack), cached."""
    if args.attack == "payload":
        return None
    from testbed.adaptive_attack import cached_attack_pool

    model = None if args.model == "default" else args.model
    tasks = args.tasks.split(",") if args.tasks else None
    pool_dir = Path(args.runs_dir) / "pools"
    return cached_attack_pool(pool_dir, args.attack, args.pool_size, seed, tasks=tasks, model=model)


PAYLOAD_QUESTIONS = 16
"""Held-out questions the payload log-likelihood is measured on (each with every payload sentence)."""


PAYLOAD_CONTEXT = {
    "before": "",
    "inside": "Let me compute. ",
    "after": "Let me compute. <answer>{answer}</answer> ",
    "start": "",
    "end": "Let me compute. ",
}
"""What precedes a payload in the attacker's completions, by place (:data:`testbed.payload_attack.PLACES`, and
the adaptive attack's, :data:`testbed.adaptive_attack.PLACES`)."""


def payload_log_likelihood(
    model: Any,
    tokenizer: Any,
    payloads: Sequence[str],
    places: Sequence[str],
    questions: int = PAYLOAD_QUESTIONS,
) -> float:
    """Mean log-probability per token that ``model`` gives each of ``payloads`` where the attacker puts it (each of
    ``places``, after the chat template and what precedes it there), over held-out questions of the default tasks."""
    import torch

    from sapo.tasks import DEFAULT_TASKS, build_held_out_dataset

    total, count = 0.0, 0
    model.eval()
    for row in build_held_out_dataset(DEFAULT_TASKS, questions):
        template = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        for place in places:
            context_ids = tokenizer(template + PAYLOAD_CONTEXT[place].format(answer=row["answer"]),
                                    add_special_tokens=False)["input_ids"]  # fmt: skip
            for payload in payloads:
                payload_ids = tokenizer(payload, add_special_tokens=False)["input_ids"]
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([context_ids + payload_ids])).logits[0].float()
                logps = torch.log_softmax(logits[len(context_ids) - 1 : -1], dim=-1)
                total += logps.gather(1, torch.tensor(payload_ids)[:, None]).sum().item()
                count += len(payload_ids)
    return total / count


def node_payload_log_likelihood(
    node_dir: Path, payloads: Sequence[str], places: Sequence[str], questions: int = PAYLOAD_QUESTIONS
) -> float | None:
    """:func:`payload_log_likelihood` of a node's latest complete checkpoint; None if it has none."""
    from sapo.checkpoints import latest_complete_checkpoint
    from sapo.models import load_trained_policy

    checkpoint = latest_complete_checkpoint(node_dir)
    if checkpoint is None:
        return None
    model, tokenizer = load_trained_policy(checkpoint)
    return payload_log_likelihood(model, tokenizer, payloads, places, questions)


def arm_figures(run_dir: Path, steps: int, payload_questions: int = PAYLOAD_QUESTIONS) -> dict[str, Any]:
    """Payload rates of one arm's honest nodes: own completions (first and last third of training), held-out
    answers (first and last evaluation), and how many attacker groups each node trained on."""
    from sapo.node.report import is_evaluation_line
    from testbed.payload_attack import payload_rate

    attacker = json.loads((run_dir / "attacker.json").read_text())
    attacker_id = attacker.get("peer_id")
    payloads, places = attacker.get("payloads", PAYLOADS), attacker.get("places", ["after"])  # older runs: after
    nodes = []
    for node_dir in sorted(run_dir.glob("node-*/")):
        lines = list(read_jsonl(node_dir / COMPLETIONS_LOG))
        train = [line for line in lines if line["kind"] == "train"]
        evaluations = sorted({line["step"] for line in lines if line["kind"] == "eval"})
        third = max(1, steps // 3)
        metrics = [json.loads(line) for line in (node_dir / "metrics.jsonl").read_text().splitlines()]
        step_lines = [m for m in metrics if not is_evaluation_line(m) and "train_runtime" not in m]
        last = [m for m in metrics if not is_evaluation_line(m)][-1]
        held_out = [m["eval/pass@1"] for m in metrics if is_evaluation_line(m) and "eval/pass@1" in m]

        def eval_rate(step: int, lines: list[dict] = lines) -> float:
            return payload_rate([x["completion"] for x in lines if x["kind"] == "eval" and x["step"] == step])

        nodes.append(
            {
                "node": node_dir.name,
                "train_payload_first": payload_rate([x["completion"] for x in train if x["step"] < third]),
                "train_payload_last": payload_rate([x["completion"] for x in train if x["step"] >= steps - third]),
                "eval_payload_start": eval_rate(evaluations[0]) if evaluations else None,
                "eval_payload_end": eval_rate(evaluations[-1]) if evaluations else None,
                "external_groups": last.get("sapo/total/external_groups", 0.0),
                "dropped": {k.split("/")[-1]: v for k, v in last.items() if k.startswith("sapo/total/dropped/")},
                **_by_sender_kind(node_dir, attacker_id),
                "local_reward_last": last.get("sapo/local_reward"),
                "local_reward_mean": _mean(m.get("sapo/local_reward") for m in step_lines),
                "step_seconds": _mean(m.get("step_time") for m in step_lines),
                "plausibility_seconds": _mean(m.get("sapo/time/plausibility", 0.0) for m in step_lines),
                # tokens of taken external completions, and those the token floor gave no weight in the loss
                "external_tokens": last.get("sapo/total/external_tokens", 0.0),
                "external_tokens_masked": last.get("sapo/total/external_tokens_masked", 0.0),
                "payload_log_likelihood_end": node_payload_log_likelihood(
                    node_dir, payloads, places, payload_questions
                ),
                "held_out_start": held_out[0] if held_out else None,
                "held_out_end": held_out[-1] if held_out else None,
            }
        )
    return {"nodes": nodes, "attacker_published_groups": attacker["published_groups"]}


def _by_sender_kind(node_dir: Path, attacker_id: str | None) -> dict[str, float]:
    """Groups a node took from and dropped of the attacker and of honest peers (its senders.json)."""
    from sapo.trainer import SENDERS_FILE

    path = node_dir / SENDERS_FILE
    outcomes = json.loads(path.read_text()) if path.exists() else {}
    figures = {f"{who}_{what}": 0.0 for who in ("attacker", "honest") for what in ("taken", "dropped", "implausible")}
    for sender, counts in outcomes.items():
        who = "attacker" if sender == attacker_id else "honest"
        figures[f"{who}_taken"] += counts.get("taken", 0)
        figures[f"{who}_dropped"] += sum(v for k, v in counts.items() if k.startswith("dropped/"))
        figures[f"{who}_implausible"] += counts.get("dropped/implausible", 0)
    return figures


def _format(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.2f}"


def _mean(values: Any) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.fmean(present) if present else None


def markdown(report: dict[str, Any]) -> list[str]:
    """The result page."""
    lines = [
        "# Completion poisoning: how far a payload spreads",
        "",
        *record_lines(report),
        *(
            [f"The arms ran on commit `{report['runs_commit']}`; this page measured them again.  "]
            if report.get("runs_commit")
            else []
        ),
        f"Setup: {report['setup']}",
        "",
        "| arm | seed | payload in own completions, first third -> last third | payload in held-out answers, start "
        "-> end | attacker groups trained on / dropped as implausible, per node | honest groups trained on / "
        "dropped as implausible, per node | groups dropped (by reason, all nodes) | local reward (mean over steps) "
        "| held-out pass@1 start -> end | s/step (plausibility check) | external tokens masked by the token floor "
        "/ taken, per node | payload log-likelihood per token at the end "
        f"(base model: {_format(report.get('base_payload_log_likelihood'))}) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["arms"]:
        nodes = row["figures"]["nodes"]

        def mean(key: str, nodes: list[dict] = nodes) -> float:
            values = [n.get(key) for n in nodes if n.get(key) is not None]
            return statistics.fmean(values) if values else float("nan")

        dropped: dict[str, float] = {}
        for node in nodes:
            for reason, count in node["dropped"].items():
                dropped[reason] = dropped.get(reason, 0) + count
        lines.append(
            f"| {row['arm']} | {row['seed']} | {mean('train_payload_first'):.1%} -> {mean('train_payload_last'):.1%} "
            f"| {mean('eval_payload_start'):.1%} -> {mean('eval_payload_end'):.1%} "
            f"| {mean('attacker_taken'):.1f} / {mean('attacker_implausible'):.1f} "
            f"| {mean('honest_taken'):.1f} / {mean('honest_implausible'):.1f} "
            f"| {', '.join(f'{k} {v:.0f}' for k, v in sorted(dropped.items()) if v) or '-'} "
            f"| {mean('local_reward_mean'):.3f} | {mean('held_out_start'):.3f} -> {mean('held_out_end'):.3f} "
            f"| {mean('step_seconds'):.1f} ({mean('plausibility_seconds'):.2f}) "
            f"| {mean('external_tokens_masked'):.0f} / {mean('external_tokens'):.0f} "
            f"| {_format(mean('payload_log_likelihood_end'))} |"
        )
    return lines


def base_payload_log_likelihood(
    model_name: str, payloads: Sequence[str], places: Sequence[str], questions: int = PAYLOAD_QUESTIONS
) -> float:
    """:func:`payload_log_likelihood` of the honest nodes' base model (``--model``: what they start from)."""
    from sapo.models import load_trained_policy

    model, tokenizer = load_trained_policy(model_name)
    return payload_log_likelihood(model, tokenizer, payloads, places, questions)


def report_again(args: argparse.Namespace) -> dict[str, Any]:
    """The report of the run directories already under ``args.runs_dir``, measured with this code; the commit the
    arms ran on comes from the previous report in ``args.results_dir``."""
    previous_path = Path(args.results_dir) / f"{args.report_name}.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
    report: dict[str, Any] = {
        **run_record(),
        "runs_commit": previous.get("runs_commit") or previous.get("git_commit"),
        "setup": previous.get("setup", ""),
        "base_payload_log_likelihood": base_payload_log_likelihood(
            args.model, args.payloads, args.places, args.payload_questions
        ),
        "arms": [
            {
                "arm": arm,
                "seed": seed,
                "figures": arm_figures(Path(args.runs_dir) / arm / f"seed-{seed}", args.steps, args.payload_questions),
            }
            for seed in (int(s) for s in args.seeds.split(","))
            for arm in args.arms.split(",")
        ],
    }
    write_report(Path(args.results_dir), args.report_name, report, markdown(report))
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every arm and seed, then write the report."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.poisoning", description=__doc__.split("\n")[0])
    parser.add_argument("--arms", default="none,default", help=f"comma-separated, of {sorted(ARMS)}")
    parser.add_argument("--attack", default="payload", choices=ATTACK_KINDS, help="what the attacker publishes")
    parser.add_argument("--pool-size", type=int, default=8, help="groups an adaptive or dos attacker samples")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument(
        "--payload-questions",
        type=int,
        default=PAYLOAD_QUESTIONS,
        help="held-out questions the payload's log-likelihood is measured on (each with every wording at every place)",
    )
    parser.add_argument("--steps", type=int, default=30, help="training steps per honest node")
    parser.add_argument("--honest", type=int, default=3, help="honest nodes per swarm (the attacker is one more)")
    parser.add_argument("--model", default="default", help="the honest nodes' model")
    parser.add_argument("--tasks", default=None, help="comma-separated reasoning-gym tasks (default: the node's)")
    parser.add_argument("--eval-questions", type=int, default=32, help="held-out questions at start and end")
    parser.add_argument("--attack-interval", type=float, default=10.0, help="seconds between attacker rounds")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds an arm may take")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "poisoning"), help="run directories")
    parser.add_argument("--results-dir", default=str(RESULTS), help="where the report goes")
    parser.add_argument("--report-name", default="poisoning", help="the report's file name, without .json/.md")
    parser.add_argument(
        "--report-only", action="store_true", help="measure the existing run directories again; run nothing"
    )
    parser.add_argument(
        "--payload-wordings", type=int, default=len(PAYLOADS), help="how many of the payload wordings the attacker uses"
    )
    parser.add_argument(
        "--payload-places", default=",".join(PLACES), help=f"comma-separated places the attacker uses, of {PLACES}"
    )
    args, node_args = parser.parse_known_args(argv)
    if not 1 <= args.payload_wordings <= len(PAYLOADS):
        parser.error(f"--payload-wordings must be 1 to {len(PAYLOADS)}; got {args.payload_wordings}")
    args.payloads, args.places = PAYLOADS[: args.payload_wordings], args.payload_places.split(",")
    if not set(args.places) <= set(PLACES):
        parser.error(f"--payload-places takes places of {PLACES}; got {args.payload_places}")
    if args.attack != "payload":  # the adaptive attacker's own wordings and places
        from testbed.adaptive_attack import ADAPTIVE_PAYLOADS
        from testbed.adaptive_attack import PLACES as ADAPTIVE_PLACES

        args.payloads, args.places = ADAPTIVE_PAYLOADS, list(ADAPTIVE_PLACES[args.attack]) or ["start"]
    args.node_args = node_args + (["--tasks", args.tasks] if args.tasks else [])
    unknown = [arm for arm in args.arms.split(",") if arm not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; choose from {sorted(ARMS)}")
    if args.report_only:
        return report_again(args)
    report: dict[str, Any] = {
        **run_record(),  # at the start: the code the arms run
        "setup": f"{args.honest} honest sapo-nodes (model {args.model}) + 1 {args.attack} attacker publishing 2 "
        f"groups every {args.attack_interval:g} s ({len(args.payloads)} payload wording(s), places {args.places}"
        + (
            f", {args.pool_size} groups sampled from the victim's public model, published in turn"
            if args.attack != "payload"
            else ""
        )
        + "), "
        f"{args.steps} steps, loopback DHT; extra node options {args.node_args}",
        "arms": [],
        "base_payload_log_likelihood": base_payload_log_likelihood(
            args.model, args.payloads, args.places, args.payload_questions
        ),
    }
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in args.arms.split(","):
            print(f"poisoning: arm {arm}, seed {seed}: {args.honest} honest nodes, {args.steps} steps", flush=True)
            run_dir = run_arm(args, arm, seed)
            report["arms"].append(
                {"arm": arm, "seed": seed, "figures": arm_figures(run_dir, args.steps, args.payload_questions)}
            )
            # after every arm: an interrupted benchmark keeps the arms it finished
            write_report(Path(args.results_dir), args.report_name, report, markdown(report))
    return report


if __name__ == "__main__":
    main()
