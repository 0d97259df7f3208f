"""What each run of ``benchmarks/sapo_table.py`` is: the benchmark's configuration (a profile of
``benchmarks/sapo_table_profiles.py`` with the command line's overrides), each (setting, seed) run's directory, archive
and identity, and the exact ``sapo-node local-swarm`` command it runs.

A run's directory and identity name it for good: a completed run is found again, skipped and reported by them (also by
a later version of this code, reading runs of an earlier one), so they change only together with the runs they name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.sapo_table_profiles import node_configs, profiles
from benchmarks.sapo_table_report import PAPER_SETTINGS, scale_setting
from benchmarks.strong_peer import model_digest

# ----------------------------------------------------------------------------------------------------
# configuration


def build_config(args: argparse.Namespace, node_args: list[str]) -> dict[str, Any]:
    """The benchmark's configuration: the profile's settings, overridden where the command line gives a value, and
    ``node_args`` (what follows ``--``) for every node; each setting is checked to scale to whole groups before
    anything runs (ValueError), and a profile's required model folders are asked for (SystemExit)."""
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


def _scales(label: str, groups: int) -> bool:
    try:
        scale_setting(label, groups)
    except ValueError:
        return False
    return True


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


# ----------------------------------------------------------------------------------------------------
# run names


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


# ----------------------------------------------------------------------------------------------------
# commands


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
