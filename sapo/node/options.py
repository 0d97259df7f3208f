"""Parsing a node's options: SAPOConfig and NodeArguments through TRL's parser, the node's defaults, `--set`,
and the effective configuration as YAML."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

USAGE = """\
sapo-node [--config node.yaml] [--set key=value ...] [--FIELD VALUE ...] [--print-config]
    Run a SAPO node. With no arguments: the embedded default model and tasks, in a new swarm.
sapo-node local-swarm --peers N [--run-dir DIR] [node options ...]
    Start N nodes on 127.0.0.1 that find each other; outputs go to one run directory.
sapo-node doctor [node options ...]
    Check this machine for a node with these options (Python, torch, GPU, memory, disk, p2pd, model, ports,
    addresses, initial peers): one line per check with its fix; exit code 1 when the node cannot run.
sapo-node eval MODEL [--tasks ...] [--questions N]
    Held-out greedy pass@1 of a model, checkpoint or LoRA adapter, per task (the questions a node evaluates on).
sapo-node report RUN_DIR
    Plot reward and held-out pass@1 over steps per node (PNG) and print a summary table.
sapo-node --help
    Every node option, with its documentation.
"""

# Settings of a node that differ from SAPOConfig's library defaults: sized for a CPU machine, checkpointing on.
NODE_DEFAULTS: dict[str, Any] = {
    "output_dir": "sapo-output",
    # The CPU profile shown to learn (benchmarks/results/profile_search.md, `lora-mix-small`: one node alone raised
    # its held-out pass@1 by more than two paired standard errors in 30 steps of ~16 s): LoRA r=16 at 2e-4,
    # constant; 2 groups of 4 completions of at most 48 tokens per step, half of them from the swarm (the paper's
    # best 50/50 mix).
    "num_local": 1,
    "num_external": 1,
    "num_generations": 4,
    # The round in one micro-batch (up to 16 rows, `sapo.config.round_micro_batch`), as the search ran it: the loss
    # pass then runs each group's prompt once (`scoring_prefill_once`); `benchmarks/results/step_limit_1thread/`.
    "per_device_train_batch_size": None,
    "max_completion_length": 48,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.0,
    "learning_rate": 2e-4,
    "lr_scheduler_type": "constant",
    "max_steps": 10000,
    "save_strategy": "steps",
    "save_steps": 10,
    "save_total_limit": 3,
    "logging_steps": 1,
    # Held-out evaluation (greedy pass@1 on questions training never draws): at step 0, every 10 steps and at the
    # last step.
    "eval_strategy": "steps",
    "eval_steps": 10,
    "eval_on_start": True,
    "eval_questions": 32,
    "per_device_eval_batch_size": 16,
    "groups_log": "groups.jsonl",  # every group judged and what happened to it (sapo.group_log)
    "held_out_log": "held_out.jsonl",  # per-question outcomes, for paired comparisons between runs
    "report_to": "none",
    "disable_tqdm": True,
}

# Training settings --print-config shows besides every SAPO and node field.
_SHOWN_TRAINING_FIELDS = (
    "output_dir", "max_steps", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
    "max_completion_length", "temperature", "learning_rate", "lr_scheduler_type", "beta", "epsilon", "epsilon_high",
    "loss_type", "reward_weights", "save_steps", "save_total_limit", "logging_steps", "eval_strategy", "eval_steps",
    "eval_on_start", "per_device_eval_batch_size", "report_to", "seed",
)  # fmt: skip


def build_parser() -> Any:
    """The TrlParser of a node: SAPOConfig plus NodeArguments, with the node's defaults.

    What depends on the machine (`use_cpu`, `gradient_checkpointing`, `bf16`) is not set here: SAPOConfig decides it
    (`sapo.config.device_defaults`) for sapo-node and for a script alike.
    """
    from trl import TrlParser

    from sapo.config import SAPOConfig
    from sapo.node.runner import NodeArguments

    parser = TrlParser((SAPOConfig, NodeArguments), prog="sapo-node", usage=USAGE)
    parser.set_defaults(**NODE_DEFAULTS)
    _accept_none(parser, (SAPOConfig, NodeArguments))
    return parser


def _accept_none(parser: Any, dataclass_types: Sequence[type]) -> None:
    """Let a numeric option whose field may be `None` take `none` (or `null`) on the command line, as a YAML file
    can, e.g. `--plausibility_margin none` turns the check off."""
    import dataclasses
    import types
    import typing

    optional = set()
    for dataclass_type in dataclass_types:
        hints = typing.get_type_hints(dataclass_type)
        for f in dataclasses.fields(dataclass_type):
            hint = hints.get(f.name)
            if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
                optional.add(f.name)
    for action in parser._actions:
        if action.dest in optional and action.type in (int, float):
            action.type = _none_or(action.type)


def _none_or(convert: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.strip().lower() in ("none", "null") else convert(text)

    parse.__name__ = convert.__name__  # argparse names the type in its error message ("invalid float value")
    return parse


def expand_set_options(argv: Sequence[str], list_fields: set[str]) -> list[str]:
    """Turn each `--set key=value` into `--key value` (comma-separated values for list fields)."""
    out: list[str] = []
    pending_set = []
    it = iter(argv)
    for arg in it:
        if arg == "--set":
            value = next(it, None)
            if value is None or "=" not in value:
                raise ValueError(f"--set needs key=value, got {value!r}")
            pending_set.append(value)
        elif arg.startswith("--set="):
            pending_set.append(arg[len("--set=") :])
        else:
            out.append(arg)
    for item in pending_set:  # after everything else, so --set wins over the flags and the YAML file
        key, value = item.split("=", 1)
        out.append(f"--{key.strip()}")
        out.extend(v for v in value.split(",") if v) if key.strip() in list_fields else out.append(value)
    return out


def parse_node_args(argv: Sequence[str]) -> tuple[Any, Any, bool]:
    """Parse a node's command line into (SAPOConfig, NodeArguments, print_config); raises NodeError."""
    import dataclasses

    from sapo.node.runner import NodeArguments, NodeError

    argv = list(argv)
    print_config = "--print-config" in argv
    argv = [a for a in argv if a != "--print-config"]
    list_fields = {f.name for f in dataclasses.fields(NodeArguments) if str(f.type).startswith("list")}
    list_fields |= {"report_to", "reward_weights"}
    parser = build_parser()
    try:
        argv = expand_set_options(argv, list_fields)
        args, node = parser.parse_args_and_config(argv)
    except ValueError as e:
        raise NodeError(_explain_parse_error(e)) from None
    except FileNotFoundError as e:
        raise NodeError(f"config file not found: {e.filename}") from None
    return args, node, print_config


def _explain_parse_error(error: ValueError) -> str:
    import re

    text = str(error)
    names = ", ".join(re.findall(r"'--([^']+)'", text))
    if text.startswith("Unknown arguments from config file"):
        return f"unknown key(s) in the config file: {names}; sapo-node --help lists the valid keys"
    if "not used by the HfArgumentParser" in text:
        return f"unknown option(s): --{names.replace(', ', ', --')}; sapo-node --help lists the valid options"
    return text


def effective_config(args: Any, node: Any) -> dict[str, Any]:
    """The settings a node runs with, as a YAML-ready mapping (feed it back with --config)."""
    import dataclasses

    from trl import GRPOConfig

    from sapo.config import SAPOConfig

    sapo_fields = [
        f.name for f in dataclasses.fields(SAPOConfig) if f.name not in {g.name for g in dataclasses.fields(GRPOConfig)}
    ]
    shown = {name: getattr(args, name) for name in (*_SHOWN_TRAINING_FIELDS, *sapo_fields, "epsilon_high")}
    shown.update(dataclasses.asdict(node))
    return {k: _yaml_value(v) for k, v in shown.items()}


def config_yaml(args: Any, node: Any) -> str:
    """`--print-config`: the effective configuration as YAML, each key under its help as a comment (the text
    `--help` shows); `--config` reads it back."""
    import dataclasses
    import textwrap

    import yaml

    from sapo.config import SAPOConfig
    from sapo.node.runner import NodeArguments
    from swarm.field_docs import field_help

    helps = {f.name: field_help(f) for cls in (SAPOConfig, NodeArguments) for f in dataclasses.fields(cls)}
    entries = []
    for key, value in effective_config(args, node).items():
        comment = [f"# {line}" for line in textwrap.wrap(helps.get(key, ""), width=110, break_on_hyphens=False)]
        entries.append("\n".join([*comment, yaml.safe_dump({key: value}, sort_keys=False).rstrip("\n")]))
    return "\n\n".join(entries) + "\n"


def _yaml_value(value: Any) -> Any:
    """A setting as plain YAML: tuples as lists, enums (TrainingArguments' strategies) as their value."""
    import enum

    if isinstance(value, enum.Enum):
        return value.value
    return list(value) if isinstance(value, tuple) else value
