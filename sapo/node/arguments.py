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


# TRL's ModelConfig, ScriptArguments and `trl grpo` script fields a node reads only to accept or refuse them.
_TRL_ACCEPTED = (
    "model_revision", "lora_task_type", "lora_target_parameters", "lora_modules_to_save", "use_rslora", "use_dora",
    "load_in_8bit", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage",
    "dataset_streaming", "ignore_bias_buffers", "reward_model_name_or_path",
)  # fmt: skip

_SECTIONS = {
    "Policy": (
        "model", "model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
        "dtype", "attn_implementation",
    ),
    "Questions and rewards": (
        "tasks", "eval_tasks", "dataset", "source", "source_args", "dataset_name", "dataset_label", "dataset_config",
        "dataset_train_split", "dataset_test_split", "question_column", "answer_column", "reward_columns",
        "eval_fraction", "dataset_size", "rewards", "reward_funcs", "max_reward_errors_in_a_row",
        "max_reward_error_rate", "max_source_errors", "allow_data_change",
    ),
    "Choosing received groups": ("sampler",),
    "TRL's other model and script arguments (accepted so that a `trl grpo` YAML runs; refused where they ask for "
    "what a node does not do)": _TRL_ACCEPTED,
    "Swarm (defaults and text of `swarm.dht.DHTTransportConfig`'s fields)": (
        "initial_peers", "host_maddrs", "announce_maddrs", "identity", "swarm_name", "client_mode", "use_auto_relay",
        "join_timeout", "rejoin_interval", "rejoin_max_interval", "membership_path", "membership_operator",
    ),
    "Waiting for peers": ("wait_for_peers", "wait_for_peers_timeout"),
    "Staying up": ("require_swarm", "min_step_seconds"),
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
    dtype: str | None = field(
        default=None,
        metadata={
            "help": "As TRL's `ModelConfig.dtype`: the dtype the policy's weights are loaded in on a GPU (`auto`: the "
            "checkpoint's). On a CPU the weights stay float32, logged (bf16 compute there follows `bf16`). `None`: "
            "float32 on a CPU, the checkpoint's on a GPU.",
            "choices": ["auto", "bfloat16", "float16", "float32"],
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "As TRL's `ModelConfig.attn_implementation` (`eager`, `sdpa`, `flash_attention_2`, ...): set on "
            "the loaded policy; one this machine lacks (flash attention on a CPU) is logged and the model's default "
            "kept. `None`: the model's default."
        },
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
            "help": "Your own questions instead of `tasks`: a local .jsonl, .json, .parquet or .csv file, a folder "
            "written by datasets' save_to_disk, or a folder of such files split by name (TRL's local form: "
            "train.jsonl, test.jsonl; read by datasets' load_dataset). Items are keyed by their content, so peers "
            "holding the same data in any order, split or filter verify each other's groups "
            "(`sapo.sources.DatasetSource`). Its name in figures and provenance is `dataset_label`."
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
            "help": "The dataset's name (its task in figures and provenance), the same on every peer that shares it; "
            "`None`: the file or folder name without its extension. Items verify by their content whatever the name: "
            "a received item this peer holds under another name counts under this peer's name."
        },
    )
    dataset_config: str | None = field(
        default=None,
        metadata={"help": "TRL's hub dataset configuration; refused here, since local data has none."},
    )
    dataset_train_split: str = field(
        default="train",
        metadata={"help": "Split of a dataset folder to train on; a file is the train split."},
    )
    dataset_test_split: str = field(
        default="test",
        metadata={
            "help": "Split of a dataset folder held out for evaluation, where the folder has it (never trained "
            "on; added to the `eval_fraction` items)."
        },
    )
    source: str | None = field(
        default=None,
        metadata={
            "help": "Your own task source instead of `tasks` or `dataset`: a `sapo.sources.TaskSource` subclass as "
            "`module:Class` or `path/to/file.py:Class`, built with `source_args`; its `rows()` are the training rows "
            "(given `size=dataset_size` and `seed` where it takes them), its `held_out()` the held-out questions "
            "(each a `datasets.Dataset` or a list of dicts). Or a `verifiers.v1.Taskset` subclass, built with its "
            "config class from `source_args` (`eval_fraction` of its tasks held out; `--rewards source` scores with "
            "its reward hooks)."
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
    question_column: str = field(
        default="question",
        metadata={
            "help": "Column of `dataset` holding the question: a string, or chat messages (the last user message is "
            "the question). Data without a `question` column but with TRL's `prompt` column use `prompt`."
        },
    )
    answer_column: str = field(
        default="answer",
        metadata={
            "help": "Column of `dataset` holding the answer (the rows' `answer`); a column of another name stays in "
            "the rows under its own name too, for rewards that read it. Data without an `answer` column but with "
            "TRL's `solution` column use `solution`."
        },
    )
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
            "help": "Reward functions: `reasoning_gym`, `math`, `format`, `source` (the `source`'s own reward: a "
            "verifiers taskset's reward hooks), or your own as `module:function` or `path/to/file.py:function` "
            "(TRL's signature: prompts, completions, **columns; one float or None per completion). Weights: "
            "`reward_weights`."
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
    max_reward_error_rate: float | None = field(
        default=0.5,
        metadata={
            "help": "The node also stops when more than this share of one reward function's last 256 own rows failed "
            "(a reward that always fails on one kind of item, however they interleave). `none`: never stops."
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
            "and the node goes on; after this many such errors in a row (an item re-derived starts the count again) "
            "the node stops, saying why. `none`: never stops."
        },
    )
    model_revision: str | None = field(
        default=None, metadata={"help": "TRL's hub revision of the model; a local model has none: logged, unused."}
    )
    lora_task_type: str = field(
        default="CAUSAL_LM", metadata={"help": "TRL's LoRA task type; a policy is a causal LM: `CAUSAL_LM` only."}
    )
    lora_target_parameters: list[str] | None = field(
        default=None, metadata={"help": "TRL's LoRA target parameters; not supported here: leave it out."}
    )
    lora_modules_to_save: list[str] | None = field(
        default=None, metadata={"help": "TRL's modules trained beside LoRA; not supported here: leave it out."}
    )
    use_rslora: bool = field(default=False, metadata={"help": "TRL's rank-stabilized LoRA; not supported here."})
    use_dora: bool = field(default=False, metadata={"help": "TRL's DoRA; not supported here."})
    load_in_8bit: bool = field(default=False, metadata={"help": "TRL's 8-bit loading; not supported here."})
    load_in_4bit: bool = field(default=False, metadata={"help": "TRL's 4-bit loading; not supported here."})
    bnb_4bit_quant_type: str = field(default="nf4", metadata={"help": "TRL's 4-bit quantization type; unused."})
    use_bnb_nested_quant: bool = field(default=False, metadata={"help": "TRL's nested 4-bit quantization; unused."})
    bnb_4bit_quant_storage: str | None = field(default=None, metadata={"help": "TRL's 4-bit storage dtype; unused."})
    dataset_streaming: bool = field(
        default=False, metadata={"help": "TRL's streaming of a hub dataset; local data is read whole: logged, unused."}
    )
    ignore_bias_buffers: bool = field(
        default=False, metadata={"help": "TRL's DDP setting for bool buffers; logged, unused."}
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "TRL's reward model; not supported here: score with reward functions (`reward_funcs`)."},
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
    rejoin_interval: float = _swarm_option("rejoin_interval")
    rejoin_max_interval: float = _swarm_option("rejoin_max_interval")
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
            "and keeps dialing the initial peers in the background (backing off to once every `rejoin_max_interval` "
            "seconds); once one answers, it joins and exchange starts without a restart."
        },
    )
    min_step_seconds: float = field(
        default=0.0,
        metadata={
            "help": "Start each training step at least this many seconds after the previous one began, resting the "
            "remainder: on a machine that does other work the node then takes a bounded share of it (a 3-second step "
            "paced to 10 s keeps it busy 30 % of the time; the swarm's exchange goes on meanwhile). 0: no rest."
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
        if not self.min_step_seconds >= 0:
            raise ValueError(f"--min_step_seconds {self.min_step_seconds}: give 0 (no rest) or more seconds")
        self._refuse_what_trl_asks_and_a_node_does_not_do()
        self._resolve_dataset_name()
        if self.dataset and Path(self.dataset).is_file() and self.dataset_train_split != "train":
            raise ValueError(
                f"--dataset_train_split {self.dataset_train_split}: {self.dataset} is a file, which is the train "
                "split; name a split of a dataset folder, or leave it out"
            )
        if self.reward_funcs is not None:
            rewards = [_reward_of_trl(name) for name in self.reward_funcs]
            if self.rewards not in (rewards, field_default(_FIELDS["rewards"])):
                raise ValueError(
                    f"--rewards {' '.join(self.rewards)} and --reward_funcs {' '.join(self.reward_funcs)} name "
                    "different rewards; give one (reward_funcs is TRL's name for rewards)"
                )
            self.rewards = rewards

    def _refuse_what_trl_asks_and_a_node_does_not_do(self) -> None:
        """TRL's model and script arguments a node cannot honour, refused (one line) where set to anything but TRL's
        default; those it merely does not use are logged at start (:func:`trl_argument_notes`)."""
        dtypes = _FIELDS["dtype"].metadata["choices"]
        if self.dtype is not None and self.dtype not in dtypes:  # argparse checks a flag's choices, not a YAML value
            raise ValueError(f"--dtype {self.dtype}: invalid choice; use one of {', '.join(dtypes)}")
        if self.lora_task_type.upper() != "CAUSAL_LM":
            raise ValueError(f"--lora_task_type {self.lora_task_type}: a policy is a causal LM; use CAUSAL_LM")
        unsupported = {
            "lora_target_parameters": self.lora_target_parameters, "lora_modules_to_save": self.lora_modules_to_save,
            "use_rslora": self.use_rslora, "use_dora": self.use_dora, "load_in_8bit": self.load_in_8bit,
            "load_in_4bit": self.load_in_4bit, "reward_model_name_or_path": self.reward_model_name_or_path,
        }  # fmt: skip
        for name, value in unsupported.items():
            if value:
                fix = "; score with reward functions (--reward_funcs)" if name.startswith("reward") else ""
                raise ValueError(f"--{name} {_shown(value)}: not supported by sapo-node: leave it out{fix}")

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
                ".json, .parquet or .csv file, a folder of such files, or a folder written by datasets' save_to_disk): "
                "download it and give its path"
            )


_FIELDS = {f.name: f for f in dataclasses.fields(NodeArguments)}


def _reward_of_trl(name: str) -> str:
    """A `reward_funcs` entry as `rewards` names it: this project's names and `module:function` as they are, TRL's
    dotted import path `module.function` as `module:function`; raises ValueError for what cannot be resolved so."""
    if name in (*REWARD_NAMES, "source") or ":" in name:
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


def trl_argument_notes(node: NodeArguments) -> list[str]:
    """One line for each TRL argument set that a node accepts but does not use, for the log at start."""
    notes = []
    if node.model_revision not in (None, "main"):
        notes.append(f"--model_revision {node.model_revision}: a local model has no revisions; unused")
    if node.dataset_streaming:
        notes.append("--dataset_streaming: local data is read whole; unused")
    if node.ignore_bias_buffers:
        notes.append("--ignore_bias_buffers: a distributed-data-parallel setting of TRL's scripts; unused")
    return notes


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value).lower()


def default_task_names() -> list[str]:
    """The names of the default reasoning-gym mix (`sapo.tasks.DEFAULT_TASKS`), `tasks`' default."""
    from sapo.tasks import DEFAULT_TASKS

    return [task.name for task in DEFAULT_TASKS]


def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default value (a fresh one from its factory); `None` where it has none."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default
