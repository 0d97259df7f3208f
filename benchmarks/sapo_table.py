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
``smoke`` for tests. What each run is (its directory, identity and command) is decided in
``benchmarks/sapo_table_settings.py``; this module runs, resumes, collects and reports the runs.

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
    cpu_model,
    git_state,
    json_safe,
    machine,
    split_at_double_dash,
    stop_processes,
    utc_now,
)
from benchmarks.sapo_table_profiles import profiles, write_node_config
from benchmarks.sapo_table_report import (
    CPU_SIZING,
    PAPER_CUMULATIVE,
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
from benchmarks.sapo_table_settings import archive_of, build_config, run_dir_of, run_identity, swarm_command

# Importable from here, as before the settings moved to their own module.
from benchmarks.sapo_table_report import PAPER_SETTINGS  # noqa: F401  isort: skip
from benchmarks.sapo_table_settings import node_options, strong_model_of  # noqa: F401  isort: skip

RUNS = ROOT / "runs" / "sapo_table"

COMPLETE = "run-complete.json"
ATTEMPTS = "attempts.jsonl"


# ----------------------------------------------------------------------------------------------------
# a run's record (what a run is and how it is run: benchmarks/sapo_table_settings.py)


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


def read_complete(run_dir: Path) -> dict[str, Any] | None:
    """The completion marker ``run_dir`` holds (written when every node reached the last step), or None."""
    try:
        return json.loads((run_dir / COMPLETE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def attempt_cpus(run_dir: Path) -> set[str]:
    """The CPU models the attempts of the run in ``run_dir`` recorded (none before attempts recorded theirs)."""
    try:
        attempts = [json.loads(line) for line in (run_dir / ATTEMPTS).read_text().splitlines()]
    except FileNotFoundError:
        return set()
    return {attempt["cpu"] for attempt in attempts if "cpu" in attempt}


def seed_cpus(config: dict[str, Any], seed: int) -> set[str]:
    """The CPU models that any setting's run of ``seed`` recorded (its attempts, or an archived run's marker)."""
    cpus: set[str] = set()
    for label in config["settings"]:
        num_local, num_external = scale_setting(label, config["groups_per_step"])
        replay = is_replay(label)
        run_dir, marker = completed(config, num_local, num_external, seed, replay)
        cpus |= set((marker or {}).get("cpus", [])) | attempt_cpus(run_dir)
    return cpus


def other_cpu(config: dict[str, Any], seed: int, cpu: str) -> str | None:
    """Why ``seed``'s runs may not run on ``cpu``: another CPU model ran a setting of that seed (a seed is another
    draw on another CPU model, so the arms of a seed share one). None: they may."""
    others = sorted(seed_cpus(config, seed) - {cpu})
    if not others:
        return None
    return f"seed {seed}'s runs ran on {', '.join(others)}, not this machine's {cpu}: run them on that CPU model"


# ----------------------------------------------------------------------------------------------------
# running


class Stop(Exception):
    """SIGTERM to the benchmark: stop like Ctrl-C."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise Stop(signal.Signals(signum).name)


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
    from sapo.node.warm_start import WarmStarter, start_node_process

    log = open(run_dir / "local-swarm.log", "a")
    process = start_node_process(  # warm where a program that started this one shares its server
        command, starter=WarmStarter.shared(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
        start_new_session=True,  # Ctrl-C reaches only this script, which then stops the swarm in order
    )  # fmt: skip
    last = None
    try:
        for raw in process.stdout:
            line = raw.decode(errors="replace")
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
    cpu = cpu_model()
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
            refusal = other_cpu(config, seed, cpu)
            if refusal is not None:
                write(f"{name}: not run: {refusal}")
                outcome["failed"].append(str(run_dir))
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
                    f.write(
                        json.dumps({"started": started, "resuming": resuming, "command": command, "cpu": cpu}) + "\n"
                    )
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
                        "cpus": sorted(attempt_cpus(run_dir)),
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
# sizing and the command line


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
