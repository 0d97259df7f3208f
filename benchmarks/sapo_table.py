"""SAPO's experience-sharing table, reproduced with real `sapo-node` processes on a real loopback DHT.

The SAPO paper (arXiv 2509.08721: 8 peers, Qwen2.5-0.5B-Instruct, ReasoningGYM, I + J = 8 groups per
round, 8 completions per question, GRPO with beta 0, epsilon 0.2 / 0.28) reports the cumulative reward of
the swarm for four mixes of I local and J external groups per round:

    8/0  561.79 (no sharing, baseline)   6/2  854.43 (+52%)   4/4  1093.31 (+94%)   2/6  945.87 (+68%)

For each setting (``--settings``) and each seed (``--seeds``) this script runs one local swarm of N peers,

    sapo-node local-swarm --peers N --run-dir RUNS/PROFILE/I-J/seed-S --seed 100*S --num_local I --num_external J ...

one run after the other, with the same seeds, tasks and every other setting for every I/J. Node i of the
swarm of seed S uses seed 100*S + i (``local-swarm`` gives node i seed + i), so no two runs of different
seeds share a node seed. Every node appends one line per training step to its ``metrics.jsonl``; the table
uses ``sapo/local_reward``: the mean reward, under the node's own reward functions, of the completions the
node generated itself that step (its I local groups, plus fill-in groups it generated when the swarm had
fewer than J usable groups). Rewards of external completions never count.

Quantities (per run = one setting and one seed):
    cumulative reward  = sum over peers p and steps t of local_reward(p, t)   (the table's headline figure,
                         like the paper's "cumulative reward"; it grows with peers x steps, so compare it
                         only within one profile)
    mean reward        = cumulative reward / number of (peer, step) pairs that logged a local reward
    gain vs 8/0        = mean over seeds of cumulative(setting) / mean over seeds of cumulative(8/0) - 1;
                         the spread is the min-max of the per-seed (paired, same seed) gains
    spread over seeds  = min-max and sample standard deviation of the cumulative reward over seeds

Profiles (each described in ``benchmarks/sapo_table_profiles.py``): ``paper`` for a GPU, ``cpu``, ``cpu-learn``,
``cpu-hard``, ``cpu-hard-specialists`` and ``cpu-hard-strong`` (``--strong-model DIR``) for a 2-core CPU machine,
``smoke`` for tests.

Resumable: a run whose directory holds ``run-complete.json`` (written when every node reached the last
step) is skipped; an unfinished run is started again in the same directory, and its nodes resume from the
newest complete checkpoint there (``--save-steps`` sets how often they write one). Completed runs' model
checkpoints are deleted to save disk (``--keep-checkpoints`` keeps them); metrics and logs stay.
Every process started is stopped: Ctrl-C or SIGTERM sends SIGTERM to the running ``local-swarm`` (which
forwards it to its nodes: they finish their step, checkpoint and leave) and waits for it.

Usage:
    python -m benchmarks.sapo_table --profile cpu --settings 8/0,4/4 --seeds 0,1   # ~4 x 15-25 minutes
    python -m benchmarks.sapo_table --profile cpu --sizing 3   # time 3 steps of the profile (scratch dir)
    python -m benchmarks.sapo_table --profile paper --model /models/Qwen2.5-0.5B-Instruct
    python -m benchmarks.sapo_table --profile smoke --model DIR --runs-dir /tmp/r --results-dir /tmp/out
    python -m benchmarks.sapo_table --profile cpu-hard-strong --strong-model DIR   # students among stronger peers
    python -m benchmarks.sapo_table --profile cpu --report-only     # table/plots from the runs so far
    Options after ``--`` are passed to every node unchanged (e.g. ``-- --temperature 0.9``).

Writes RESULTS_DIR/sapo_table_<profile>.{json,md,png} (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS,
    ROOT,
    commit_label,
    git_state,
    json_safe,
    machine,
    split_at_double_dash,
    stop_processes,
    utc_now,
)
from benchmarks.sapo_table_profiles import node_configs, profiles, write_node_config
from benchmarks.sapo_table_report import (
    CPU_SIZING,
    PAPER_CUMULATIVE,
    PAPER_SETTINGS,
    format_table,
    is_replay,
    load_metrics,
    load_run,
    notes,
    run_summary,
    scale_setting,
    table,
    verdict,
    write_outputs,
)
from benchmarks.strong_peer import model_digest

RUNS = ROOT / "runs" / "sapo_table"

COMPLETE = "run-complete.json"
ATTEMPTS = "attempts.jsonl"


# ----------------------------------------------------------------------------------------------------
# settings and commands


def run_dir_of(
    runs_dir: Path, profile: str, num_local: int, num_external: int, seed: int, replay: bool = False
) -> Path:
    """A run's directory: ``PROFILE/I-J/seed-S`` (``I-J-replay`` for a self-replay setting such as ``4/4r``)."""
    return runs_dir / profile / f"{num_local}-{num_external}{'-replay' if replay else ''}" / f"seed-{seed}"


def archive_of(config: dict[str, Any], num_local: int, num_external: int, seed: int, replay: bool = False) -> Path:
    """Where a finished run is kept for good: its nodes' metrics and its completion marker (with the commit it ran
    on) under the results directory, which is committed; run directories (checkpoints) are not."""
    results = Path(config["results_dir"]) / "sapo_table_runs"
    return run_dir_of(results, config["profile"], num_local, num_external, seed, replay)


def archive_run(run_dir: Path, archive: Path, marker: dict[str, Any]) -> None:
    """Copy every node's metrics.jsonl and held-out outcomes (held_out.jsonl, question by question, where the node
    wrote them) and the completion marker (written last) of a finished run to ``archive``."""
    for kept in sorted([*run_dir.glob("node-*/metrics.jsonl"), *run_dir.glob("node-*/held_out.jsonl")]):
        target = archive / kept.parent.name / kept.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kept, target)
    (archive / COMPLETE).write_text(json.dumps(marker, indent=1))


def completed(
    config: dict[str, Any], num_local: int, num_external: int, seed: int, replay: bool = False
) -> tuple[Path, dict | None]:
    """(the directory holding the run's metrics, its completion marker or None): the archive once it has one."""
    archive = archive_of(config, num_local, num_external, seed, replay)
    marker = read_complete(archive)
    if marker is not None:
        return archive, marker
    run_dir = run_dir_of(Path(config["runs_dir"]), config["profile"], num_local, num_external, seed, replay)
    return run_dir, read_complete(run_dir)


def node_options(
    config: dict[str, Any], num_local: int, num_external: int, seed: int, run_dir: Path, replay: bool = False
) -> list[str]:
    """The options every node of one run gets (after ``local-swarm``'s own); a self-replay setting's nodes fill their
    J slots from their own earlier groups (``--replay only``) instead of the swarm."""
    from sapo.speed.devices import round_micro_batch

    rows = (num_local + num_external) * config["num_generations"]
    micro_batch = round_micro_batch(rows, 1, config["num_generations"], largest=config["max_batch"])
    # with strong peers each node's config names its model (a flag would override it)
    options = [] if config.get("strong_model") else ["--model", config["model"]]
    options += [
        "--num_local", str(num_local), "--num_external", str(num_external),
        "--num_generations", str(config["num_generations"]),
        "--per_device_train_batch_size", str(micro_batch),
        "--max_completion_length", str(config["max_completion_length"]),
        "--max_steps", str(config["steps"]),
        "--save_steps", str(config["save_steps"]), "--save_total_limit", "2",
        "--sampling_strategy", config["sampling_strategy"],
        "--swarm_name", f"sapo-table-{config['profile']}-{num_local}-{num_external}{'r' if replay else ''}-s{seed}",
        "--rewards", *config["rewards"],
    ]  # fmt: skip
    if replay:
        options += ["--replay", "only"]
    if config["learning_rate"] is not None:
        options += ["--learning_rate", str(config["learning_rate"])]
    if config["dataset_size"] is not None:
        options += ["--dataset_size", str(config["dataset_size"])]
    if config["lr_scheduler_type"] is not None:
        options += ["--lr_scheduler_type", config["lr_scheduler_type"]]
    if config["lora_r"] == 0:
        options += ["--lora_r", "0"]
    elif config["lora_r"] is not None:
        options += ["--lora_r", str(config["lora_r"]), "--lora_alpha", str(2 * config["lora_r"]), "--lora_dropout", "0"]
    for name in ("eval_questions", "eval_steps"):
        if config[name] is not None:
            options += [f"--{name}", str(config[name])]
    if config["tasks"] is not None:
        options += ["--config", str(run_dir / "node-config.yaml")]
    return options + list(config["node_args"])


def swarm_command(
    config: dict[str, Any], num_local: int, num_external: int, seed: int, run_dir: Path, replay: bool = False
) -> list[str]:
    """The exact ``sapo-node local-swarm`` command of one run (specialists, strong peers: the per-node configs of
    :func:`~benchmarks.sapo_table_profiles.node_configs`, which local-swarm hands to node i in turn)."""
    own_configs = [["--node-config", str(run_dir / name)] for name in node_configs(config)]
    return [
        sys.executable, "-m", "sapo.node.cli", "local-swarm",
        "--peers", str(config["peers"]), "--run-dir", str(run_dir), "--seed", str(100 * seed),
        "--status-interval", str(config["status_interval"]), *(arg for pair in own_configs for arg in pair),
        *node_options(config, num_local, num_external, seed, run_dir, replay),
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# running


class Stop(Exception):
    """SIGTERM to the benchmark: stop like Ctrl-C."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise Stop(signal.Signals(signum).name)


def run_identity(
    config: dict[str, Any], num_local: int, num_external: int, seed: int, replay: bool = False
) -> dict[str, Any]:
    """What a completed run was run with: a marker with another identity is not this run."""
    keep = ("profile", "peers", "num_generations", "max_completion_length", "steps", "model", "tasks", "rewards")
    keep += ("sampling_strategy", "learning_rate", "dataset_size", "node_args")
    keep += ("lr_scheduler_type", "lora_r", "eval_questions", "eval_steps")
    identity = {**{k: config[k] for k in keep}, "num_local": num_local, "num_external": num_external, "seed": seed}
    if config.get("specialists"):  # only where set: the markers of runs before the field stay this run's
        identity["specialists"] = True
    if replay:  # likewise
        identity["replay"] = "only"
    if config.get("strong_model"):  # the weights, not the path: a run of another model is not this run
        identity["strong_model_digest"] = config["strong_model_digest"]
    return identity


def read_complete(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / COMPLETE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def nodes_finished(run_dir: Path, peers: int, steps: int) -> bool:
    """Every node logged its last step."""
    for i in range(peers):
        rows, _ = load_metrics(run_dir / f"node-{i}" / "metrics.jsonl")
        if not rows or max(r["step"] for r in rows) < steps:
            return False
    return True


def remove_checkpoints(run_dir: Path) -> None:
    """Model checkpoints and final models of a completed run (GBs each); metrics and logs stay."""
    for path in [*run_dir.glob("node-*/checkpoint-*"), *run_dir.glob("node-*/final")]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def run_swarm(command: list[str], run_dir: Path, write: Any) -> int:
    """Run one local swarm to its end, relaying its status lines; always stops it (SIGTERM by PID, wait)."""
    log = open(run_dir / "local-swarm.log", "a")
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        start_new_session=True,  # Ctrl-C reaches only this script, which then stops the swarm in order
    )  # fmt: skip
    last = None
    try:
        for line in process.stdout:
            log.write(line)
            log.flush()
            if line != last:  # status lines repeat while nothing changes: show each state once
                write(f"  {run_dir.parent.name}/{run_dir.name}: {line.rstrip()}")
            last = line
        return process.wait()
    finally:
        if process.poll() is None:
            write(f"stopping local-swarm (pid {process.pid}): its nodes checkpoint and leave")
            stop_processes([process], grace=600)
        log.close()


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM raises Stop and SIGINT KeyboardInterrupt (also when a shell started us with SIGINT ignored), so
    the ``finally`` of :func:`run_swarm` always stops the swarm it started."""
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_stop),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_all(config: dict[str, Any], write: Any = print) -> dict[str, Any]:
    """Run every (setting, seed) not yet complete; returns {'started': [...], 'skipped': [...], 'failed': [...]}."""
    from tqdm.auto import tqdm

    # Seed-major, so a session cut short leaves complete pairs (every setting on the same seeds), not one setting alone.
    runs = [(label, seed) for seed in config["seeds"] for label in config["settings"]]
    outcome: dict[str, list[str]] = {"started": [], "skipped": [], "failed": []}
    tree = git_state()  # the commit every run of this invocation runs on
    if tree["dirty"] and not config["allow_dirty"]:
        raise SystemExit(
            "sapo_table: the tree has uncommitted changes; commit them first (every run records the commit it ran "
            "on), or pass --allow-dirty for a run that says so"
        )
    bar = tqdm(total=len(runs), desc=f"sapo_table {config['profile']}", unit="run", dynamic_ncols=True)
    try:
        for label, seed in runs:
            num_local, num_external = scale_setting(label, config["groups_per_step"])
            replay = is_replay(label)
            run_dir = run_dir_of(Path(config["runs_dir"]), config["profile"], num_local, num_external, seed, replay)
            name = f"{label} (run as {num_local}/{num_external}{' by self-replay' if replay else ''}) seed {seed}"
            identity = run_identity(config, num_local, num_external, seed, replay)
            _, marker = completed(config, num_local, num_external, seed, replay)
            if marker is not None:
                if marker.get("identity") != identity:
                    raise SystemExit(
                        f"sapo_table: {run_dir} holds a completed run of another configuration; "
                        "use another --runs-dir or delete that directory"
                    )
                outcome["skipped"].append(str(run_dir))
                bar.set_postfix_str(f"{name}: complete, skipped")
                bar.update()
                continue
            write_node_config(run_dir, config)
            command = swarm_command(config, num_local, num_external, seed, run_dir, replay)
            ok = False
            for attempt in range(1 + config["retries"]):
                bar.set_postfix_str(f"{name}: running" + (f" (retry {attempt})" if attempt else ""))
                run_dir.mkdir(parents=True, exist_ok=True)
                resuming = any(run_dir.glob("node-*/checkpoint-*"))
                started = time.time()
                with open(run_dir / ATTEMPTS, "a") as f:
                    f.write(json.dumps({"started": started, "resuming": resuming, "command": command}) + "\n")
                write(f"{name}: {'resuming' if resuming else 'starting'} in {run_dir}")
                code = run_swarm(command, run_dir, write)
                outcome["started"].append(str(run_dir))
                if code == 0 and nodes_finished(run_dir, config["peers"], config["steps"]):
                    marker = {
                        "identity": identity,
                        "command": command,
                        "finished": time.time(),
                        "last_attempt_seconds": time.time() - started,
                        "attempts": len((run_dir / ATTEMPTS).read_text().splitlines()),
                        "code": tree,
                    }
                    (run_dir / COMPLETE).write_text(json.dumps(marker, indent=1))
                    archive_run(run_dir, archive_of(config, num_local, num_external, seed, replay), marker)
                    if not config["keep_checkpoints"]:
                        remove_checkpoints(run_dir)
                    ok = True
                    break
                write(f"{name}: local-swarm exited with {code} before every node finished; see {run_dir}/node-*/")
            if not ok:
                outcome["failed"].append(str(run_dir))
            bar.update()
    finally:
        bar.close()
    return outcome


# ----------------------------------------------------------------------------------------------------
# aggregation


def collect(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (setting, seed) run of the config, with per-peer per-step figures and its summary."""
    runs = []
    for label in config["settings"]:
        num_local, num_external = scale_setting(label, config["groups_per_step"])
        replay = is_replay(label)
        for seed in config["seeds"]:
            run_dir, marker = completed(config, num_local, num_external, seed, replay)
            identity = run_identity(config, num_local, num_external, seed, replay)
            complete = marker is not None and marker.get("identity") == identity
            nodes = load_run(run_dir, config["peers"], config["steps"])
            try:
                attempts = len((run_dir / ATTEMPTS).read_text().splitlines())
            except FileNotFoundError:  # an archived run keeps the count in its marker
                attempts = (marker or {}).get("attempts", 0)
            runs.append(
                {
                    "setting": label,
                    "num_local": num_local,
                    "num_external": num_external,
                    "replay": replay,
                    "seed": seed,
                    "run_dir": str(run_dir),
                    "complete": complete,
                    "attempts": attempts,
                    "command": marker.get("command") if marker else None,
                    "last_attempt_seconds": marker.get("last_attempt_seconds") if marker else None,
                    "code": marker.get("code") if marker else None,
                    **run_summary(nodes),
                    "peers": nodes,
                }
            )
    return runs


# ----------------------------------------------------------------------------------------------------
# outputs


def _scales(label: str, groups: int) -> bool:
    try:
        scale_setting(label, groups)
    except ValueError:
        return False
    return True


def build_config(args: argparse.Namespace, node_args: list[str]) -> dict[str, Any]:
    profile = profiles()[args.profile]
    model = args.model or profile.model
    if model is None:
        raise SystemExit(f"sapo_table: --model DIR is required for the {profile.name} profile")
    if model != "default":
        model = str(Path(model).resolve())
    strong_model = strong_model_of(profile.name, profile.strong_peers, args.strong_model)
    groups = args.groups_per_step or profile.groups_per_step
    if args.settings:
        settings = [s.strip() for s in args.settings.split(",") if s.strip()]
        for label in settings:
            scale_setting(label, groups)  # fail before anything runs
    else:  # the paper's settings that scale to whole groups (2 groups: 8/0 and 4/4)
        settings = [label for label in PAPER_SETTINGS if _scales(label, groups)]
    tasks = None
    if profile.tasks is not None:
        tasks = [{"name": t.name, "config": dict(t.config), "weight": t.weight} for t in profile.tasks]
    return {
        "profile": profile.name,
        "settings": settings,
        "seeds": [int(s) for s in args.seeds.split(",")] if args.seeds else list(profile.seeds),
        "peers": args.peers or profile.peers,
        "groups_per_step": groups,
        "num_generations": args.num_generations or profile.num_generations,
        "max_completion_length": args.max_completion_length or profile.max_completion_length,
        "steps": args.steps or profile.steps,
        "save_steps": args.save_steps or profile.save_steps,
        "model": model,
        "strong_model": strong_model,
        "strong_model_digest": None if strong_model is None else model_digest(strong_model),
        "tasks": tasks,
        "rewards": list(profile.rewards),
        "sampling_strategy": profile.sampling_strategy,
        "learning_rate": profile.learning_rate,
        "lr_scheduler_type": profile.lr_scheduler_type,
        "lora_r": profile.lora_r,
        "eval_questions": profile.eval_questions,
        "specialists": profile.specialists,
        "eval_steps": profile.eval_steps,
        "dataset_size": profile.dataset_size,
        "max_batch": profile.max_batch,
        "status_interval": args.status_interval or profile.status_interval,
        "window": args.window or profile.window,
        "retries": args.retries,
        "keep_checkpoints": args.keep_checkpoints,
        "results_dir": str(Path(args.results_dir).resolve()),
        "allow_dirty": args.allow_dirty,
        "runs_dir": str(Path(args.runs_dir).resolve()),
        "node_args": node_args,
        "profile_notes": list(profile.notes),
    }


def strong_model_of(profile: str, strong_peers: bool, given: str | None) -> str | None:
    """The stronger peers' model folder (absolute), required by a profile with strong peers and refused by others."""
    if given is None and strong_peers:
        raise SystemExit(
            f"sapo_table: --strong-model DIR is required for the {profile} profile: the stronger peers' model folder "
            "(python -m benchmarks.strong_peer --adapter ADAPTER --out DIR makes one from a trained LoRA adapter)"
        )
    if given is not None and not strong_peers:
        raise SystemExit(
            f"sapo_table: --strong-model is for a profile with stronger peers (cpu-hard-strong), not {profile}"
        )
    return None if given is None else str(Path(given).resolve())


def sizing(config: dict[str, Any], steps: int, write: Any = print, budget: float = 1800.0) -> int:
    """Time ``steps`` steps of the profile's swarm (first setting and seed) and print how many fit ``budget``."""
    import resource

    label, seed = config["settings"][0], config["seeds"][0]
    num_local, num_external = scale_setting(label, config["groups_per_step"])
    replay = is_replay(label)
    config = {**config, "steps": steps, "runs_dir": str(Path(config["runs_dir"]) / "sizing")}
    run_dir = run_dir_of(Path(config["runs_dir"]), config["profile"], num_local, num_external, seed, replay)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    write_node_config(run_dir, config)
    load_before = os.getloadavg()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    code = run_swarm(swarm_command(config, num_local, num_external, seed, run_dir, replay), run_dir, write)
    wall = time.time() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    nodes = load_run(run_dir, config["peers"], steps)
    first = [n["time"][0] for n in nodes.values() if n["time"]]
    # step 1 of each node carries its warm-up: the median over the later steps is the steady cost
    later = [b - a for n in nodes.values() for a, b in zip(n["time"][1:], n["time"][2:], strict=False)]
    per_step = statistics.median(later) if later else math.nan
    startup = (min(first) - started) if first else math.nan
    fit = int((budget - startup) // per_step) if later and per_step > 0 else None
    result = {
        "profile": config["profile"], "peers": config["peers"], "setting": label,
        "run_as": f"{num_local}/{num_external}", "steps": steps, "exit_code": code, "wall_seconds": wall,
        "startup_seconds": startup,
        "seconds_per_step_median": per_step, "step_durations": later, "steps_for_budget": fit,
        "budget_seconds": budget, "cpu_seconds_all_processes": cpu, "load_before": load_before,
        "load_after": os.getloadavg(),
        "date": utc_now(),
    }  # fmt: skip
    (run_dir.parent / "sizing.json").write_text(json.dumps(json_safe(result), indent=1))
    print(json.dumps(json_safe(result), indent=1))
    return code


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv, node_args = split_at_double_dash(argv)
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="Options after -- go to every node unchanged."
    )
    parser.add_argument("--profile", choices=sorted(profiles()), default="cpu", help="default cpu")
    parser.add_argument(
        "--settings", default=None, help="paper I/J settings, e.g. 8/0,4/4 (default: those that scale to I + J)"
    )
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the profile's)")
    parser.add_argument("--model", default=None, help="local HF model directory (paper, smoke: required)")
    parser.add_argument(
        "--strong-model", default=None, help="the stronger peers' model folder (cpu-hard-strong: required; odd nodes)"
    )
    parser.add_argument("--peers", type=int, default=None, help="peers per swarm (default: the profile's)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per peer (default: the profile's)")
    parser.add_argument("--groups-per-step", type=int, default=None, help="I + J (default: the profile's)")
    parser.add_argument("--num-generations", type=int, default=None, help="G, completions per question")
    parser.add_argument("--max-completion-length", type=int, default=None, help="new tokens per completion")
    parser.add_argument("--save-steps", type=int, default=None, help="checkpoint every this many steps")
    parser.add_argument("--status-interval", type=float, default=None, help="seconds between status lines")
    parser.add_argument("--window", type=int, default=None, help="moving-average window of the plot")
    parser.add_argument("--retries", type=int, default=1, help="restarts (resuming) of a failed run (default 1)")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep completed runs' checkpoints")
    parser.add_argument("--runs-dir", default=str(RUNS), help=f"run directories (default {RUNS.relative_to(ROOT)})")
    parser.add_argument("--results-dir", default=str(RESULTS), help="where the json/md/png go")
    parser.add_argument("--report-only", action="store_true", help="start nothing; report the runs so far")
    parser.add_argument(
        "--allow-dirty", action="store_true", help="run on a tree with uncommitted changes (recorded in each run)"
    )
    parser.add_argument(
        "--sizing", type=int, default=None, metavar="STEPS",
        help="measure instead: run the first setting and seed for STEPS steps (scratch run dir) and print the "
        "seconds per step with the profile's peers, and the steps that fit 30 minutes",
    )  # fmt: skip
    return parser.parse_args(argv), node_args


def main(argv: Sequence[str] | None = None) -> int:
    args, node_args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = build_config(args, node_args)
    except ValueError as e:
        print(f"sapo_table: error: {e}", file=sys.stderr)
        return 2
    from tqdm.auto import tqdm

    outcome = None
    if args.sizing or not args.report_only:
        try:
            with stop_on_signals():
                if args.sizing:
                    return sizing(config, args.sizing, write=tqdm.write)
                outcome = run_all(config, write=tqdm.write)
        except (KeyboardInterrupt, Stop) as e:
            print(f"\nsapo_table: interrupted ({type(e).__name__}); run the same command to resume", flush=True)
            return 130
    runs = collect(config)
    rows = table(runs, config["settings"])
    command = " ".join(
        [Path(sys.executable).name, *(sys.argv if argv is None else ["benchmarks/sapo_table.py", *argv])]
    )
    setup = (
        f"{config['peers']} sapo-node processes per swarm (local-swarm, loopback DHT), model {config['model']}"
        f"{'' if config['strong_model'] is None else ' (odd nodes: ' + config['strong_model'] + ')'}, "
        f"I + J = {config['groups_per_step']} groups x G = {config['num_generations']} completions of at most "
        f"{config['max_completion_length']} tokens per step, {config['steps']} steps, seeds "
        f"{','.join(map(str, config['seeds']))}, tasks "
        f"{'node default mix' if config['tasks'] is None else ', '.join(t['name'] for t in config['tasks'])}, "
        f"sampling {config['sampling_strategy']}"
    )
    report = {
        "command": command,
        "config": {k: v for k, v in config.items() if k != "profile_notes"},
        "git_commit": commit_label(),
        "machine": machine(),
        "date": utc_now(),
        "setup": setup,
        "metric": "cumulative reward = sum over peers and steps of sapo/local_reward",
        "paper_reference": PAPER_CUMULATIVE,
        "cpu_sizing": CPU_SIZING,
        "table": rows,
        "runs": runs,
        "notes": notes(config, runs, outcome),
    }
    paths = write_outputs(report, Path(args.results_dir))
    print("\n".join(format_table(rows)))
    print("\n".join(verdict(rows)))
    print(f"\nwrote {paths['json']}, {paths['md']}, {paths['png']}")
    return 1 if outcome and outcome["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
