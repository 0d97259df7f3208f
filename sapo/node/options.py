"""A node's options: NodeArguments (its own settings), parsed with SAPOConfig through TRL's parser, the node's
defaults, `--set`, and the effective configuration as YAML."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm.dht import DHTTransportConfig
from swarm.field_docs import document_fields, field_help

logger = logging.getLogger(__name__)

REWARD_NAMES = ("reasoning_gym", "math", "format")
"""The reward functions a node knows by name (`sapo.node.runner.build_rewards`)."""

# TRL's own reward names (`trl grpo`'s registry): their functions are not this project's.
_TRL_REWARD_NAMES = (
    "accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment",
)  # fmt: skip


def _swarm_option(name: str, *, source: str | None = None, note: str = "") -> Any:
    """A node option that is DHTTransportConfig's field `source` (default: `name`): its default and its help, read from
    there rather than restated, plus `note` on what the node adds."""
    swarm_field = {f.name: f for f in dataclasses.fields(DHTTransportConfig)}[source or name]
    text = field_help(swarm_field)
    metadata = {"help": f"{text} {note}".strip()}
    if swarm_field.default_factory is not dataclasses.MISSING:
        return field(default_factory=swarm_field.default_factory, metadata=metadata)
    return field(default=swarm_field.default, metadata=metadata)


_SECTIONS = {
    "Policy": (
        "model", "model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
    ),
    "Questions and rewards": (
        "tasks", "eval_tasks", "dataset", "source", "source_args", "dataset_name", "dataset_label", "dataset_config",
        "dataset_train_split", "dataset_test_split", "question_column", "answer_column", "reward_columns",
        "eval_fraction", "dataset_size", "rewards", "reward_funcs", "max_reward_errors_in_a_row", "max_source_errors",
        "allow_data_change",
    ),
    "Swarm (defaults and text of `swarm.dht.DHTTransportConfig`'s fields)": (
        "initial_peers", "host_maddrs", "announce_maddrs", "identity", "swarm_name", "client_mode", "use_auto_relay",
        "join_timeout", "membership_path", "membership_operator",
    ),
    "Waiting for peers": ("wait_for_peers", "wait_for_peers_timeout"),
    "Staying up": ("require_swarm",),
    "Status page": ("status_port", "status_host"),
}  # fmt: skip


@document_fields(_SECTIONS, default_text={"tasks": "the default reasoning-gym mix (`sapo.tasks.DEFAULT_TASKS`)"})
@dataclass
class NodeArguments:
    """Settings of a `sapo-node` besides the GRPO/SAPO training ones ([`SAPOConfig`]). Every field is documented
    once, by its `help`; the swarm options are fields of `swarm.dht.DHTTransportConfig`, with its defaults and text."""

    model: str = field(
        default="default",
        metadata={
            "help": '`"default"` for the embedded SmolLM2-135M-Instruct, a local Hugging Face causal-LM directory, a '
            "GGUF file, or an installed package that ships one (converted once into a cached copy)."
        },
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "TRL's name for `model` (`trl.ModelConfig`): give one of the two, or both the same."},
    )
    use_peft: bool | None = field(
        default=None,
        metadata={
            "help": "As TRL's `ModelConfig.use_peft`: `true` trains LoRA adapters of rank `lora_r`, `false` every "
            "weight; `None`: `lora_r` decides."
        },
    )
    lora_r: int = field(
        default=0,
        metadata={"help": "LoRA rank; `0` trains every weight, a positive rank trains LoRA adapters through PEFT."},
    )
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA branch."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Modules that get LoRA adapters (`peft.LoraConfig.target_modules`); `None`: every linear."},
    )
    tasks: list[str] = field(
        default_factory=lambda: default_task_names(),
        metadata={
            "help": "reasoning-gym dataset names. Names of the default mix use its easy settings; other names use "
            "reasoning-gym's defaults. In a YAML file an item may also be `{name: ..., config: {...}, weight: 1.0}`."
        },
    )
    eval_tasks: list[str] | None = field(
        default=None,
        metadata={
            "help": "reasoning-gym tasks of the held-out evaluation, written as `tasks` is; `None`: the node's "
            "`tasks`. A task specialist (one task in `tasks`) evaluated on a whole mix sets the mix here."
        },
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Your own questions instead of `tasks`: a local .jsonl, .json, .parquet or .csv file, or a folder "
            "written by datasets' save_to_disk. Items are keyed by their content, so peers holding the same data "
            "in any order, split or filter verify each other's groups (`sapo.sources.DatasetSource`)."
        },
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "TRL's name for `dataset` (`trl.ScriptArguments`): a local file or folder as `dataset` takes; "
            "there is no hub here, so download a hub dataset first. With `dataset` also given, a value that names "
            "no file or folder is read as `dataset_label` (deprecated)."
        },
    )
    dataset_label: str | None = field(
        default=None,
        metadata={
            "help": "The dataset's name, the same on every peer that shares it; `None`: the file or folder name."
        },  # fmt: skip
    )
    dataset_config: str | None = field(
        default=None,
        metadata={"help": "TRL's hub dataset configuration; refused here, since local data has none."},
    )
    dataset_train_split: str = field(
        default="train",
        metadata={"help": "Split of a save_to_disk folder to train on; a file is the train split."},
    )
    dataset_test_split: str = field(
        default="test",
        metadata={
            "help": "Split of a save_to_disk folder held out for evaluation, where the folder has it (never trained "
            "on; added to the `eval_fraction` items)."
        },
    )
    source: str | None = field(
        default=None,
        metadata={
            "help": "Your own task source instead of `tasks` or `dataset`: a `sapo.sources.TaskSource` subclass as "
            "`module:Class` or `path/to/file.py:Class`, built with `source_args`; its `rows()` are the training rows "
            "(given `size=dataset_size` and `seed` where it takes them), its `held_out()` the held-out questions."
        },
    )
    source_args: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments of `source`'s class: a mapping in the YAML file, or JSON on the command line."
        },
    )
    question_column: str = field(default="question", metadata={"help": "Column of `dataset` holding the question."})
    answer_column: str = field(default="answer", metadata={"help": "Column of `dataset` holding the answer."})
    reward_columns: list[str] | None = field(
        default=None,
        metadata={"help": "Columns of `dataset` handed to the reward functions; `None`: every other column."},
    )
    eval_fraction: float = field(
        default=0.1,
        metadata={
            "help": "Share of `dataset`'s items held out for the held-out evaluation, chosen by item key (the same "
            "items on every peer; never trained on). Solved means the rewards' weighted sum reaches "
            "`success_threshold`."
        },
    )
    dataset_size: int = field(
        default=10000, metadata={"help": "reasoning-gym questions generated (procedurally, offline)."}
    )
    rewards: list[str] = field(
        default_factory=lambda: ["reasoning_gym", "format"],
        metadata={
            "help": "Reward functions: `reasoning_gym`, `math`, `format`, or your own as `module:function` or "
            "`path/to/file.py:function` (TRL's signature: prompts, completions, **columns; one float or None per "
            "completion). Weights: `reward_weights`."
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "TRL's name for `rewards` (`trl grpo`): names as `rewards` takes them, or a dotted "
            "`module.function` as TRL imports it; TRL's own reward names are not known here."
        },
    )
    max_reward_errors_in_a_row: int | None = field(
        default=64,
        metadata={
            "help": "A reward function that raises on one of the node's own rows scores that row as failed (`None`: "
            "no reward) and the node goes on, logging the row's item and the error; after this many failed rows of "
            "one function in a row the node stops, saying why in node.log and status.json. `none`: never stops."
        },
    )
    allow_data_change: bool = field(
        default=False,
        metadata={
            "help": "Resume an output directory whose recorded data (fingerprint, columns, split, sources in "
            "node-run.json) differs from this run's. By default such a resume is refused: another split could train "
            "on items held out before."
        },
    )
    max_source_errors: int | None = field(
        default=100,
        metadata={
            "help": "A task source that raises while re-deriving a received item drops that group (`source_error`) "
            "and the node goes on; after this many such errors the node stops, saying why. `none`: never stops."
        },
    )
    initial_peers: list[str] = _swarm_option("initial_peers")
    host_maddrs: list[str] = _swarm_option("host_maddrs")
    announce_maddrs: list[str] | None = _swarm_option("announce_maddrs")
    identity: str | None = _swarm_option(
        "identity", source="identity_path", note="In sapo-node, `None` is `identity.key` in the output directory."
    )
    swarm_name: str = _swarm_option("swarm_name")
    client_mode: bool = _swarm_option("client_mode")
    use_auto_relay: bool = _swarm_option("use_auto_relay")
    join_timeout: float = _swarm_option("join_timeout")
    membership_path: str | None = _swarm_option("membership_path")
    membership_operator: str | None = _swarm_option("membership_operator")
    wait_for_peers: int = field(
        default=0,
        metadata={
            "help": "Before the first step, wait until this many other peers are listed in the swarm, so that a "
            "swarm started together trains together (`local-swarm` sets it to the number of other nodes)."
        },
    )
    wait_for_peers_timeout: float = field(
        default=300.0,
        metadata={"help": "Seconds to wait for them; after that the node trains anyway, with a warning."},
    )
    require_swarm: bool = field(
        default=False,
        metadata={
            "help": "Exit (code 3) when no initial peer answers within `join_timeout`. By default the node then "
            "trains alone (every slot filled with its own groups), says so in its log, status.json and status page, "
            "and keeps dialing the initial peers in the background (backing off to once a minute); once one "
            "answers, it joins and exchange starts without a restart."
        },
    )
    status_port: int | None = field(
        default=31338,
        metadata={
            "help": "TCP port of the node's status page (`/`), its JSON (`/status.json`), Prometheus metrics "
            "(`/metrics`) and health (`/healthz`, 503 when unhealthy). If the port is taken, a free one is used "
            "(logged, and written to status.json); 0 always picks a free one; `none` serves no page."
        },
    )
    status_host: str = field(
        default="127.0.0.1",
        metadata={
            "help": "Interface the status page listens on. `127.0.0.1` (default): this machine only. `0.0.0.0` opens "
            "it to every network this machine is on, without password or TLS: whoever reaches the port reads the "
            "node's peer id, addresses, peers, metrics and log messages (which may hold file paths). Open it only "
            "behind a firewall, or reach it through an SSH tunnel (`ssh -L 31338:127.0.0.1:31338 HOST`)."
        },
    )

    def __post_init__(self) -> None:
        """Read TRL's script and model arguments with TRL's meaning: `model_name_or_path` is `model`, `use_peft`
        decides LoRA, `dataset_name` is the data to load, `reward_funcs` is `rewards`; raises ValueError (one line)
        on two different values for one setting or on what only a hub could load."""
        if self.model_name_or_path is not None:
            if self.model not in ("default", self.model_name_or_path):
                raise ValueError(
                    f"--model {self.model} and --model_name_or_path {self.model_name_or_path} name two models; "
                    "give one (model_name_or_path is TRL's name for model)"
                )
            self.model = self.model_name_or_path
        if self.use_peft is True and self.lora_r <= 0:
            raise ValueError(f"--use_peft true needs a positive --lora_r (got {self.lora_r})")
        if self.use_peft is False:
            self.lora_r = 0  # TRL's meaning: every weight trained
        if self.dataset_config is not None:
            raise ValueError(
                f"--dataset_config {self.dataset_config}: a hub dataset's configuration; sapo-node loads local files "
                "and folders, which have none: leave it out"
            )
        self._resolve_dataset_name()
        if self.dataset and Path(self.dataset).is_file() and self.dataset_train_split != "train":
            raise ValueError(
                f"--dataset_train_split {self.dataset_train_split}: {self.dataset} is a file, which is the train "
                "split; name a split of a save_to_disk folder, or leave it out"
            )
        if self.reward_funcs is not None:
            rewards = [_reward_of_trl(name) for name in self.reward_funcs]
            if self.rewards not in (rewards, _field_default(_FIELDS["rewards"])):
                raise ValueError(
                    f"--rewards {' '.join(self.rewards)} and --reward_funcs {' '.join(self.reward_funcs)} name "
                    "different rewards; give one (reward_funcs is TRL's name for rewards)"
                )
            self.rewards = rewards

    def _resolve_dataset_name(self) -> None:
        """`dataset_name` as TRL reads it (the data), or as this project read it before (the label, deprecated)."""
        name = self.dataset_name
        if name is None:
            return
        if Path(name).exists():
            if self.dataset not in (None, name):
                raise ValueError(
                    f"--dataset_name {name} and --dataset {self.dataset} name two datasets; give one (dataset_name is "
                    "TRL's name for dataset; --dataset_label names it)"
                )
            self.dataset = name
        elif self.dataset is not None:
            if self.dataset_label not in (None, name):
                raise ValueError(
                    f"--dataset_label {self.dataset_label} and --dataset_name {name} name the dataset twice; give "
                    "--dataset_label only"
                )
            logger.warning(
                "--dataset_name %s as the dataset's label is deprecated (it is the data to load, as in TRL): use "
                "--dataset_label %s",
                name,
                name,
            )
            self.dataset_label = name
        else:
            raise ValueError(
                f"--dataset_name {name}: no such local file or folder; sapo-node loads only local data (a .jsonl, "
                ".json, .parquet or .csv file, or a folder written by datasets' save_to_disk): download it and give "
                "its path"
            )


_FIELDS = {f.name: f for f in dataclasses.fields(NodeArguments)}


def _reward_of_trl(name: str) -> str:
    """A `reward_funcs` entry as `rewards` names it: this project's names and `module:function` as they are, TRL's
    dotted import path `module.function` as `module:function`; raises ValueError for what cannot be resolved so."""
    if name in REWARD_NAMES or ":" in name:
        return name
    if name in _TRL_REWARD_NAMES:
        raise ValueError(
            f"--reward_funcs {name}: TRL's own reward is not known here; use {', '.join(REWARD_NAMES)} or your own "
            "as module:function (or module.function)"
        )
    module, _, function = name.rpartition(".")
    if not module or not function:
        raise ValueError(
            f"--reward_funcs {name}: unknown reward; use {', '.join(REWARD_NAMES)} or your own as module:function "
            "(or module.function)"
        )
    return f"{module}:{function}"


def default_task_names() -> list[str]:
    from sapo.tasks import DEFAULT_TASKS

    return [task.name for task in DEFAULT_TASKS]


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

    class NodeParser(TrlParser):
        given: dict[str, Any] = {}

        def format_help(self) -> str:
            return short_help(self)

        def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
            parsed, rest = super().parse_known_args(args, namespace)
            self.given = dict(vars(parsed))
            return parsed, rest

    parser = NodeParser((SAPOConfig, NodeArguments), prog="sapo-node")
    parser.set_defaults(**NODE_DEFAULTS)
    _accept_none(parser, (SAPOConfig, NodeArguments))
    _accept_auto(parser)
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
    parser = build_parser()
    try:
        argv = expand_set_options(argv, list_fields)
        args, node = parser.parse_args_and_config(argv)
    except ValueError as e:
        raise NodeError(_explain_parse_error(e)) from None
    except FileNotFoundError as e:
        raise NodeError(f"config file not found: {e.filename}") from None
    return NodeOptions(args, node, print_config, parser.given)


def full_help() -> str:
    """`sapo-node --help-all`: every option under its section heading."""
    from sapo.node.help import full_help as every_option

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
            default = _field_default(f)
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


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def config_yaml(options: NodeOptions) -> str:
    """`--print-config`: the effective configuration as YAML, each key under its help as a comment (the text
    `--help-all` shows); `--config` reads it back into the same configuration."""
    import textwrap

    import yaml

    from sapo.config import SAPOConfig

    helps = {f.name: field_help(f) for cls in (SAPOConfig, NodeArguments) for f in dataclasses.fields(cls)}
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
