"""A node's own settings: NodeArguments (everything of a `sapo-node` besides SAPOConfig's training fields), each
field documented once by its help, with TRL's script and model argument names read with TRL's meaning."""

from __future__ import annotations

import dataclasses
import logging
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
    "Choosing received groups": ("sampler",),
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
    sampler: str | None = field(
        default=None,
        metadata={
            "help": "Your own sampling strategy: a `sapo.sampling.ExternalSampler` subclass as `module:Class` or "
            "`path/to/file.py:Class`, registered under its class name and used as `sampling_strategy` (its options: "
            "the `SAPOConfig` fields its `config_fields` names). `None`: `sampling_strategy` picks a built-in one."
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
            if self.rewards not in (rewards, field_default(_FIELDS["rewards"])):
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
    """The names of the default reasoning-gym mix (`sapo.tasks.DEFAULT_TASKS`), `tasks`' default."""
    from sapo.tasks import DEFAULT_TASKS

    return [task.name for task in DEFAULT_TASKS]


def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default value (a fresh one from its factory); `None` where it has none."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default
