"""A node's command line: SAPOConfig and NodeArguments parsed through TRL's parser with the node's defaults, `--set`,
`none` and `auto` as values, and the effective configuration as YAML (`--print-config`). NodeArguments itself lives in
`sapo.node.arguments` and is importable from here, as before."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import yaml

# REWARD_NAMES and default_task_names stay importable from here, where they were defined before NodeArguments moved.
from sapo.node.arguments import REWARD_NAMES, NodeArguments, default_task_names, field_default  # noqa: F401
from swarm.field_docs import field_help

# Settings of a node that differ from SAPOConfig's library defaults: sized for a CPU machine, checkpointing on.
NODE_DEFAULTS: dict[str, Any] = {
    "output_dir": "sapo-output",
    # The CPU profile the profile search chose (benchmarks/README.md): LoRA r=16 at 2e-4, constant; 2 groups of 4
    # completions of at most 48 tokens per step, half of them from the swarm (the paper's best 50/50 mix).
    "num_local": 1,
    "num_external": 1,
    "num_generations": 4,
    # The round in one micro-batch (up to 16 rows, `sapo.speed.devices.round_micro_batch`): the loss pass then runs each
    # group's prompt once (`scoring_prefill_once`).
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

# Training settings --print-config always shows (with every SAPO and node field), whatever their value.
_SHOWN_TRAINING_FIELDS = (
    "output_dir", "max_steps", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
    "max_completion_length", "temperature", "learning_rate", "lr_scheduler_type", "beta", "epsilon", "epsilon_high",
    "loss_type", "reward_weights", "save_steps", "save_total_limit", "logging_steps", "eval_strategy", "eval_steps",
    "eval_on_start", "per_device_eval_batch_size", "report_to", "seed",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class NodeOptions:
    """A parsed node command line.

    Parameters:
        args (`SAPOConfig`): the training configuration, as the trainer gets it.
        node (`NodeArguments`): the node's own settings.
        print_config (`bool`): `--print-config` was given.
        given (`dict[str, Any]`): each option's value as given (by a flag, `--set`, the `--config` file, or a
            default) before the configuration derived the rest; what `--print-config` writes.
    """

    args: Any
    node: Any
    print_config: bool
    given: dict[str, Any]


def build_parser() -> Any:
    """The TrlParser of a node: SAPOConfig plus NodeArguments, with the node's defaults; its `--help` is the short
    one (:func:`sapo.node.help.short_help`) and it remembers the values given (:attr:`NodeOptions.given`).

    What depends on the machine (`use_cpu`, `gradient_checkpointing`, `bf16`, the speed-ups' switches:
    `sapo.speed.devices.DEVICE_FIELDS`) is not set here: SAPOConfig decides it (`sapo.speed.devices.device_defaults`)
    for sapo-node and for a script alike. These options also take `auto` (a flag or a `--config` value), which leaves
    them to the machine as leaving them out does.
    """
    from trl import TrlParser

    from sapo.config import SAPOConfig
    from sapo.node.help import short_help
    from sapo.sampling import sampling_strategy_help

    class NodeParser(TrlParser):
        given: dict[str, Any] = {}

        def format_help(self) -> str:
            return short_help(self)

        def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
            parsed, rest = super().parse_known_args(args, namespace)
            self.given = dict(vars(parsed))
            return parsed, rest

        def error(self, message: str) -> Any:  # one line, as every other refusal (argparse prints its usage first)
            from sapo.node.errors import NodeError

            raise NodeError(f"{message}; sapo-node --help lists the options")

    parser = NodeParser((SAPOConfig, NodeArguments), prog="sapo-node")
    parser.set_defaults(**NODE_DEFAULTS)
    _accept_none(parser, (SAPOConfig, NodeArguments))
    _accept_auto(parser)
    for action in parser._actions:
        if action.dest == "sampling_strategy":
            action.help = sampling_strategy_help()  # with the strategies registered by now (--sampler)
    return parser


def _accept_auto(parser: Any) -> None:
    """Let each device-dependent option take `auto` (`None`: decided on the machine that runs), on the command line
    and in a `--config` file (argparse converts a string default from the file with the option's type)."""
    from sapo.speed.devices import DEVICE_FIELDS

    for action in parser._actions:
        if action.dest in DEVICE_FIELDS and action.type is not None:
            action.type = _auto_or(action.type)


def _auto_or(convert: Any) -> Any:
    from sapo.speed.devices import AUTO

    def parse(text: Any) -> Any:
        return None if isinstance(text, str) and text.strip().lower() == AUTO else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def _accept_none(parser: Any, dataclass_types: Sequence[type]) -> None:
    """Let a numeric option whose field may be `None` take `none` (or `null`) on the command line, as a YAML file
    can, e.g. `--plausibility_margin none` turns the check off."""
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
    options = parse_node_options(argv)
    return options.args, options.node, options.print_config


def parse_node_options(argv: Sequence[str]) -> NodeOptions:
    """Parse a node's command line (flags, `--config`, `--set`, `--print-config`); raises NodeError."""
    from sapo.node.errors import NodeError

    argv = list(argv)
    print_config = "--print-config" in argv
    argv = [a for a in argv if a != "--print-config"]
    list_fields = {f.name for f in dataclasses.fields(NodeArguments) if str(f.type).startswith("list")}
    list_fields |= {"report_to", "reward_weights"}
    try:
        argv = expand_set_options(argv, list_fields)
        argv = with_user_sampler(argv)
        parser = build_parser()
        args, node = parser.parse_args_and_config(argv)
    except ValueError as e:  # UnicodeDecodeError too: a config file that is not text
        raise NodeError(_explain_parse_error(e)) from None
    except FileNotFoundError as e:
        raise NodeError(f"config file not found: {e.filename}") from None
    except OSError as e:
        raise NodeError(f"config file {e.filename}: cannot be read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise NodeError(f"config file {_config_path(argv)}: not valid YAML: {_yaml_problem(e)}") from None
    return NodeOptions(args, node, print_config, parser.given)


def with_user_sampler(argv: list[str]) -> list[str]:
    """Load and register the sampling strategy `--sampler` names (on the command line, else in the `--config` file)
    before the configuration is parsed, so that `sampling_strategy` accepts it; ``argv`` with `sampling_strategy` set
    to it unless given. A `sampling_strategy` that names another strategy is a NodeError."""
    from sapo.node.errors import NodeError
    from sapo.node.user_code import user_sampler
    from sapo.sampling import sampler_name

    from_file = _config_file_values(argv)
    spec = _flag_value(argv, "sampler") or from_file.get("sampler")
    if not spec:
        return argv
    name = user_sampler(str(spec))
    strategy = _flag_value(argv, "sampling_strategy") or from_file.get("sampling_strategy")
    if strategy is None:
        return [*argv, "--sampling_strategy", name]
    if sampler_name(str(strategy)) != name:
        raise NodeError(
            f"--sampler {spec} is the strategy {name!r} but sampling_strategy is {strategy!r}: give only one of them"
        )
    return argv


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    """The last value given to option ``name`` in ``argv`` (`--a_b V`, `--a-b V` or `--a_b=V`); None if absent."""
    spellings = {f"--{name}", f"--{name.replace('_', '-')}"}
    value = None
    for i, arg in enumerate(argv):
        flag, equals, rest = arg.partition("=")
        if flag in spellings:
            value = rest if equals else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def _config_file_values(argv: Sequence[str]) -> dict[str, Any]:
    """The mapping in the `--config` file ``argv`` names; empty when there is none or it does not read as one (the
    parser then says what is wrong with it)."""
    import yaml

    path = _flag_value(argv, "config")
    if not path:
        return {}
    try:
        with open(path) as f:
            values = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return {}
    return values if isinstance(values, dict) else {}


def _config_path(argv: Sequence[str]) -> str | None:
    """The `--config` file of a command line, or None."""
    argv = list(argv)
    return argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None


def _yaml_problem(error: Any) -> str:
    """A YAML error in one line: what is wrong and where (line and column, counted from 1)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def output_dir_of(argv: Sequence[str]) -> str | None:
    """Where a node with this command line would write (for a refusal of the command line itself, before it parsed):
    its `--output_dir` flag or `--set output_dir=...`, else the `--config` file's `output_dir` (read line by line when
    the file is not valid YAML), else the node's default when the file says none; None when it cannot be told."""
    import re

    argv = list(argv)
    found = None
    for k, arg in enumerate(argv):
        key, _, value = arg.partition("=")
        if key in ("--output_dir", "--output-dir"):
            found = value or (argv[k + 1] if k + 1 < len(argv) else None)
        elif arg == "--set" and k + 1 < len(argv) and argv[k + 1].startswith("output_dir="):
            found = argv[k + 1].partition("=")[2]
    if found:
        return found
    config = _config_path(argv)
    if config is None:
        return NODE_DEFAULTS["output_dir"]
    try:
        text = open(config, encoding="utf-8").read()
    except (OSError, ValueError):
        return None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        match = re.search(r"^output[_-]dir:\s*['\"]?([^'\"#\n]+?)['\"]?\s*(#.*)?$", text, flags=re.M)
        return match.group(1) if match else None
    if not isinstance(data, dict):
        return None
    return str(data.get("output_dir") or data.get("output-dir") or NODE_DEFAULTS["output_dir"])


def full_help(argv: Sequence[str] = ()) -> str:
    """`sapo-node --help-all`: every option under its section heading, with the sampling strategy a `--sampler` in
    ``argv`` (or in its `--config` file) names among the strategies listed; raises NodeError for a bad one."""
    from sapo.node.help import full_help as every_option

    with_user_sampler(list(argv))
    return every_option(build_parser())


def _explain_parse_error(error: ValueError) -> str:
    import re

    text = str(error)
    names = ", ".join(re.findall(r"'--([^']+)'", text))
    if text.startswith("Unknown arguments from config file"):
        return f"unknown key(s) in the config file: {names}; sapo-node --help lists the valid keys"
    if "not used by the HfArgumentParser" in text:
        return f"unknown option(s): --{names.replace(', ', ', --')}; sapo-node --help lists the valid options"
    return text


def effective_config(options: NodeOptions) -> dict[str, Any]:
    """The settings a node runs with, as a YAML-ready mapping that `--config` turns back into the same configuration:
    every node and SAPO field, the usual training fields, and every other field given a value other than its
    default. A field is written as given. A device-dependent field (`use_cpu`, `bf16`, `gradient_checkpointing`, the
    speed-ups' switches: `sapo.speed.devices.DEVICE_FIELDS`) not set by the user is written as `auto`, so that the
    machine that reads the file decides it (a file printed on a CPU host does not force the CPU on a GPU host); any
    other SAPO field left to `None` that the configuration decided is written as decided."""
    from trl import GRPOConfig

    from sapo.config import SAPOConfig
    from sapo.speed.devices import AUTO, DEVICE_FIELDS

    sapo_own = {f.name for f in dataclasses.fields(SAPOConfig)} - {f.name for f in dataclasses.fields(GRPOConfig)} | {
        "epsilon_high",
        "use_cpu",
        "gradient_checkpointing",
        "bf16",
    }
    shown: dict[str, Any] = {}
    for obj in (options.args, options.node):
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            default = field_default(f)
            given = options.given.get(f.name, default)
            decided = getattr(obj, f.name)
            if obj is options.args and f.name in DEVICE_FIELDS:
                shown[f.name] = AUTO if given is None else given
            elif f.name in sapo_own and given is None and decided is not None:
                shown[f.name] = decided
            elif obj is options.node or f.name in sapo_own or f.name in _SHOWN_TRAINING_FIELDS:
                shown[f.name] = given
            elif _yaml_value(given) != _yaml_value(default):
                shown[f.name] = given
    return {k: _yaml_value(v) for k, v in shown.items()}


def config_yaml(options: NodeOptions) -> str:
    """`--print-config`: the effective configuration as YAML, each key under its help as a comment (the text
    `--help-all` shows); `--config` reads it back into the same configuration."""
    import textwrap

    import yaml

    from sapo.config import SAPOConfig
    from sapo.sampling import sampling_strategy_help

    helps = {f.name: field_help(f) for cls in (SAPOConfig, NodeArguments) for f in dataclasses.fields(cls)}
    helps["sampling_strategy"] = sampling_strategy_help()  # with the strategies registered by now, as --help-all
    entries = []
    for key, value in effective_config(options).items():
        comment = [f"# {line}" for line in textwrap.wrap(helps.get(key, ""), width=110, break_on_hyphens=False)]
        entries.append("\n".join([*comment, yaml.safe_dump({key: value}, sort_keys=False).rstrip("\n")]))
    return "\n\n".join(entries) + "\n"


def _yaml_value(value: Any) -> Any:
    """A setting as plain YAML: tuples as lists, enums (TrainingArguments' strategies) as their value, dataclasses
    (TrainingArguments' accelerator settings) as mappings."""
    import enum

    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _yaml_value(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, list | tuple):
        return [_yaml_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _yaml_value(v) for k, v in value.items()}
    return value
