"""A running SAPO node: policy, questions, rewards, DHT swarm and SAPOTrainer, with checkpoints and metrics."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm.dht import DHTTransportConfig
from swarm.field_docs import document_fields, field_help

logger = logging.getLogger(__name__)

# Figures that define a run: an output directory written under one set of them cannot be resumed under another.
_RUN_IDENTITY_FIELDS = (
    "model", "tasks", "dataset", "rewards", "lora_r", "num_local", "num_external", "num_generations", "seed",
)  # fmt: skip


class NodeError(Exception):
    """A problem the user can fix (bad address, missing model, unknown task...): one line, with the fix."""

    exit_code = 2


class ErrorLimitReached(NodeError):
    """Training stopped: a reward function or a task source kept raising past its limit."""

    exit_code = 4


class JoinError(NodeError):
    """No initial peer answered."""

    exit_code = 3


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
    "Policy": ("model", "lora_r", "lora_alpha", "lora_dropout"),
    "Questions and rewards": (
        "tasks", "eval_tasks", "dataset", "source", "source_args", "dataset_name", "question_column",
        "answer_column", "reward_columns",
        "eval_fraction", "dataset_size", "rewards", "max_reward_errors_in_a_row", "max_source_errors",
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
    lora_r: int = field(
        default=0,
        metadata={"help": "LoRA rank; `0` trains every weight, a positive rank trains LoRA adapters through PEFT."},
    )
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA branch."})
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
            "help": "The dataset's name, the same on every peer that shares it; `None`: the file or folder name."
        },  # fmt: skip
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


def default_task_names() -> list[str]:
    from sapo.tasks import DEFAULT_TASKS

    return [task.name for task in DEFAULT_TASKS]


# ----------------------------------------------------------------------------------------------------
# building the parts


def task_specs(names: list[Any]) -> list[Any]:
    """TaskSpecs for the `tasks` setting: default-mix settings for known names, dict items as given."""
    from sapo.tasks import DEFAULT_TASKS, TaskSpec, validate_task_names

    defaults = {task.name: task for task in DEFAULT_TASKS}
    specs = []
    for item in names:
        if isinstance(item, dict):
            unknown = set(item) - {"name", "config", "weight"}
            if "name" not in item or unknown:
                raise NodeError(f"a tasks item must be {{name, config, weight}}, got keys {sorted(item)}")
            specs.append(TaskSpec(item["name"], dict(item.get("config") or {}), float(item.get("weight", 1.0))))
        else:
            specs.append(defaults.get(str(item)) or TaskSpec(str(item)))
    try:
        validate_task_names(specs)
    except ValueError as e:
        raise NodeError(str(e)) from None
    return specs


def build_questions(node: NodeArguments, seed: int) -> tuple[Any, list[Any]]:
    """The node's training rows and the task sources it holds: your own dataset, or the reasoning-gym task mix."""
    from sapo.sources import DatasetSource, ReasoningGymSource

    if node.source:
        if node.dataset:
            raise NodeError("give --source or --dataset, not both (a source class can read your data itself)")
        source = user_source(node.source, node.source_args)
        try:
            rows = source.rows(**_accepted(source.rows, {"size": node.dataset_size, "seed": seed}))
        except Exception as e:
            raise NodeError(f"source {node.source}: rows() raised {type(e).__name__}: {e}") from None
        if isinstance(rows, list):
            from datasets import Dataset

            rows = Dataset.from_list(rows)
        logger.info("questions: %s, %d training rows", source.describe(), len(rows))
        return rows, [source]
    if node.dataset:
        name = node.dataset_name or Path(node.dataset).stem or "dataset"
        try:
            source = DatasetSource(
                node.dataset, name, node.question_column, node.answer_column, columns=node.reward_columns,
                eval_fraction=node.eval_fraction,
            )  # fmt: skip
        except (FileNotFoundError, ValueError, KeyError) as e:
            raise NodeError(str(e)) from None
        logger.info("questions: %s, %d held out for evaluation", source.describe(), len(source.held_out()))
        return source.rows(), [source]
    source = ReasoningGymSource(task_specs(node.tasks))
    return source.rows(size=node.dataset_size, seed=seed), [source]


def user_source(spec: str, arguments: dict[str, Any] | str | None) -> Any:
    """The task source `spec` names (`module:Class` or `path/to/file.py:Class`), built with ``arguments`` (a mapping,
    or JSON text); raises NodeError saying what is wrong."""
    import importlib
    import importlib.util
    import inspect

    from sapo.sources import TaskSource

    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as e:
            raise NodeError(f"--source_args must be a JSON object, got {arguments!r} ({e})") from None
    if arguments is not None and not isinstance(arguments, dict):
        raise NodeError(f"--source_args must be a mapping of keyword arguments, got {type(arguments).__name__}")
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise NodeError(f"--source {spec!r}: name a class as module:Class or path/to/file.py:Class")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise NodeError(f"--source {spec!r}: file {path} not found")
            module_spec = importlib.util.spec_from_file_location(f"sapo_user_source_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as e:
        raise NodeError(f"--source {spec!r}: cannot import {where!r} ({e}); is it on PYTHONPATH?") from None
    cls = getattr(module, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, TaskSource)):
        raise NodeError(f"--source {spec!r}: {where} has no sapo.sources.TaskSource subclass {name!r}")
    try:
        return cls(**(arguments or {}))
    except Exception as e:
        raise NodeError(f"--source {spec!r}: {name}(**source_args) raised {type(e).__name__}: {e}") from None


def _accepted(func: Any, offered: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``offered`` that ``func``'s signature takes by name."""
    import inspect

    parameters = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return offered
    return {k: v for k, v in offered.items() if k in parameters}


def build_rewards(names: list[str]) -> list[Any]:
    """Reward functions by name, or your own as `module:function` / `path/to/file.py:function`."""
    from rewards import format_reward, math_reward, reasoning_gym_reward

    known = {"reasoning_gym": reasoning_gym_reward, "math": math_reward, "format": format_reward}
    if not names:
        raise NodeError(f"no reward function given; choose from {sorted(known)} or name your own as module:function")
    return [known[name] if name in known else _user_reward(name, known) for name in names]


def _user_reward(spec: str, known: dict[str, Any]) -> Any:
    """The function `spec` names (`module:function` or `file.py:function`), checked to be callable."""
    import importlib
    import importlib.util

    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise NodeError(f"unknown reward function {spec!r}; choose from {sorted(known)} or name your own as "
                        "module:function or path/to/file.py:function")  # fmt: skip
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise NodeError(f"reward {spec!r}: file {path} not found")
            module_spec = importlib.util.spec_from_file_location(f"sapo_user_rewards_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as e:
        raise NodeError(f"reward {spec!r}: cannot import {where!r} ({e}); is it on PYTHONPATH?") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise NodeError(f"reward {spec!r}: {where} has no function {name!r}")
    return function


def load_model(node: NodeArguments) -> tuple[Any, Any]:
    """The policy and tokenizer, with LoRA adapters when `lora_r > 0`."""
    from sapo.models import LoraSpec, load_policy

    lora = LoraSpec(r=node.lora_r, alpha=node.lora_alpha, dropout=node.lora_dropout) if node.lora_r > 0 else None
    try:
        return load_policy(None if node.model == "default" else node.model, lora=lora)
    except (FileNotFoundError, ValueError, ModuleNotFoundError, OSError) as e:
        raise NodeError(str(e)) from None


def check_addresses(node: NodeArguments) -> None:
    """Fail fast, before any model is loaded, on a multiaddr that cannot work."""
    from swarm.dht import validate_multiaddr

    listen = [*node.host_maddrs, *(node.announce_maddrs or [])]
    checks = [(a, True) for a in node.initial_peers] + [(a, False) for a in listen]
    for addr, needs_peer_id in checks:
        try:
            validate_multiaddr(addr, require_peer_id=needs_peer_id)
        except ValueError as e:
            raise NodeError(str(e)) from None


def start_swarm(node: NodeArguments, output_dir: Path, model_name: str) -> Any:
    """Join (or start) the DHT swarm; print the address others pass to join.

    When no initial peer answers: raise :class:`JoinError` if ``node.require_swarm``, else start alone and keep
    dialing the initial peers in the background (``DHTTransportConfig.rejoin_peers``, with backoff).
    """
    from swarm.dht import DHTTransport, DHTTransportConfig, SwarmJoinError

    identity = Path(node.identity) if node.identity else output_dir / "identity.key"
    config = DHTTransportConfig(
        swarm_name=node.swarm_name,
        initial_peers=list(node.initial_peers),
        host_maddrs=list(node.host_maddrs),
        announce_maddrs=list(node.announce_maddrs or []) or None,
        identity_path=str(identity),
        client_mode=node.client_mode,
        use_auto_relay=node.use_auto_relay,
        join_timeout=node.join_timeout,
        membership_path=node.membership_path,
        membership_operator=node.membership_operator,
        model_name=model_name,
        state_dir=str(output_dir),
    )
    if node.initial_peers:
        logger.info("joining swarm %r through %s", node.swarm_name, ", ".join(node.initial_peers))
    else:
        logger.info("starting a new swarm %r (no initial peers)", node.swarm_name)
    try:
        swarm = DHTTransport(config)
    except SwarmJoinError as e:
        if node.require_swarm or not node.initial_peers:
            raise JoinError(str(e)) from None
        logger.warning("%s", e)
        logger.warning(
            "no initial peer answered: training alone (every slot filled with this node's own groups) and dialing "
            "%s in the background; the node joins once one answers (--require_swarm exits instead)",
            ", ".join(node.initial_peers),
        )
        try:
            swarm = DHTTransport(dataclasses.replace(config, initial_peers=[], rejoin_peers=list(node.initial_peers)))
        except SwarmJoinError as e:
            raise JoinError(str(e)) from None
    except ValueError as e:
        raise NodeError(str(e)) from None
    addresses = swarm.visible_addresses()
    (output_dir / "address.txt").write_text("\n".join(addresses) + "\n")
    peer_id = addresses[0].rsplit("/p2p/", 1)[-1] if addresses else "-"
    print(
        f"\nsapo-node {peer_id} (key fingerprint {swarm.peer_id}) is in swarm {node.swarm_name!r}. Others join it "
        "with:", file=sys.stderr,
    )  # fmt: skip
    print(f"  sapo-node --initial-peers {' '.join(addresses)}\n", file=sys.stderr, flush=True)
    return swarm


def await_peers(swarm: Any, count: int, timeout: float) -> None:
    """Wait until `count` other peers are listed (logging every 10 s); warn and go on after `timeout`."""
    from swarm.transport import wait_for_peers

    logger.info("waiting up to %.0f s for %d other peer(s) before the first step", timeout, count)
    last_log = [time.monotonic()]

    def progress(seen: int, waited: float) -> None:
        if time.monotonic() - last_log[0] >= 10.0:
            last_log[0] = time.monotonic()
            logger.info("%d of %d peer(s) listed after %.0f s", seen, count, waited)

    peers = wait_for_peers(swarm, count, timeout, on_wait=progress)
    if len(peers) < count:
        logger.warning(
            "only %d of %d peer(s) listed after %.0f s; training anyway (external slots are filled in locally "
            "until groups of others arrive)", len(peers), count, timeout
        )  # fmt: skip
    else:
        logger.info("%d peer(s) listed; starting", len(peers))


def claim_output_dir(output_dir: Path, identity: dict[str, Any]) -> None:
    """Record which run owns `output_dir`; refuse one that belongs to a run with another config."""
    output_dir.mkdir(parents=True, exist_ok=True)
    marker = output_dir / "node-run.json"
    if marker.exists():
        previous = json.loads(marker.read_text())
        changed = {k: (previous.get(k), v) for k, v in identity.items() if previous.get(k) != v}
        if changed:
            detail = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
            raise NodeError(
                f"output directory {output_dir} belongs to a run with a different config ({detail}); "
                "use another --output-dir, or restore that config to resume it"
            )
        return
    from sapo.checkpoints import write_atomically

    write_atomically(marker, json.dumps(identity, indent=1, sort_keys=True))


def data_identity(node: NodeArguments, dataset: Any, sources: list[Any]) -> dict[str, Any]:
    """What a run's data is: a fingerprint of its training items and held-out items (their provenances, in any
    order), the columns, the split settings and the sources held."""
    import hashlib

    from sapo.sources import DatasetSource

    digest = hashlib.sha256()
    for provenance in sorted(str(p) for p in dataset["provenance"]):
        digest.update(provenance.encode())
    for source in sources:
        if isinstance(source, DatasetSource):
            for row in source.held_out():
                digest.update(b"held-out:" + str(row["provenance"]).encode())
    split = {"eval_fraction": node.eval_fraction, "question_column": node.question_column,
             "answer_column": node.answer_column, "reward_columns": node.reward_columns,
             "dataset_name": node.dataset_name}  # fmt: skip
    return {
        "fingerprint": digest.hexdigest()[:32],
        "columns": sorted(dataset.column_names),
        "split": split if node.dataset else {},
        "sources": [source.describe() for source in sources],
    }


def claim_data(output_dir: Path, identity: dict[str, Any], allow_change: bool = False) -> None:
    """Record the run's data in node-run.json; refuse to resume a run whose data, columns, split or sources differ
    (a different split could train on items held out before), unless ``allow_change``."""
    from sapo.checkpoints import write_atomically

    marker = output_dir / "node-run.json"
    recorded = json.loads(marker.read_text()) if marker.exists() else {}
    previous = recorded.get("data")
    if previous is not None and previous != identity:
        changed = ", ".join(k for k in identity if previous.get(k) != identity[k])
        if not allow_change:
            raise NodeError(
                f"output directory {output_dir} was trained on other data ({changed} differ from node-run.json); "
                "resume with the same data and split, use another --output-dir, or pass --allow_data_change"
            )
        logger.warning("resuming with other data (%s differ from node-run.json): --allow_data_change", changed)
    if previous != identity:
        write_atomically(marker, json.dumps({**recorded, "data": identity}, indent=1, sort_keys=True))


def quiet_library_progress_bars() -> None:
    """The node shows one progress bar (its steps); the libraries' load/save bars would interleave with it."""
    import datasets
    import transformers

    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


# ----------------------------------------------------------------------------------------------------
# running


def run_node(args: Any, node: NodeArguments) -> int:
    """Run one node until `max_steps` or a signal; returns the process exit code."""
    try:
        return _run(args, node)
    except NodeError as e:
        print(f"sapo-node: error: {e}", file=sys.stderr)
        return e.exit_code


def _run(args: Any, node: NodeArguments) -> int:
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from sapo.checkpoints import latest_complete_checkpoint, set_aside_incomplete
    from sapo.node.about import model_label, sapo_version
    from sapo.node.board import BoardLogHandler, StatusBoard
    from sapo.node.callbacks import (
        EvaluateAtEnd,
        GracefulStop,
        MetricsJsonl,
        NodeProgress,
        NodeStatus,
        StopRequested,
        SwarmLog,
    )
    from sapo.node.logs import setup_logging
    from sapo.reward_guard import RewardErrorLimit, RewardGuard, check_reward_columns
    from sapo.sources import SourceErrorLimit
    from sapo.trainer import SAPOTrainer

    # Cheap checks first: a typo must not cost a model load.
    check_addresses(node)
    try:
        guard = RewardGuard(node.max_reward_errors_in_a_row)
    except ValueError as e:
        raise NodeError(f"--max_reward_errors_in_a_row: {e}") from None
    reward_funcs = guard.wrap_all(build_rewards(node.rewards))
    if not node.dataset and not node.source:
        task_specs(node.tasks)
    held_out_tasks = task_specs(node.eval_tasks) if node.eval_tasks else None
    output_dir = Path(args.output_dir)
    claim_output_dir(
        output_dir, {k: _plain(getattr(node if hasattr(node, k) else args, k)) for k in _RUN_IDENTITY_FIELDS}
    )
    # Removed on the way out: a caller in the same process (a script, a test) keeps no handler on a closed stream.
    log_handlers = setup_logging(output_dir, args.log_level if args.log_level not in ("passive", None) else "info")
    quiet_library_progress_bars()

    stop = GracefulStop().install()
    board = StatusBoard(
        node_name=f"sapo-node {output_dir.name}", max_steps=args.max_steps, version=sapo_version(),
        model=model_label(node.model),
    )  # fmt: skip
    status = NodeStatus(output_dir, board)
    page = start_status_page(node, board, status)
    problems = BoardLogHandler(board)
    logging.getLogger().addHandler(problems)
    registry = None
    board.count_errors(lambda: {"reward": guard.errors, "source": registry.source_errors if registry else 0})
    swarm = trainer = None
    try:
        set_aside_incomplete(output_dir)
        resume = latest_complete_checkpoint(output_dir)
        status.set("building questions", _step(resume) or 0)
        with stop.abandonable("loading"):
            dataset, sources = build_questions(node, seed=args.seed)
            try:
                check_reward_columns(reward_funcs, dataset.column_names)
            except ValueError as e:
                raise NodeError(str(e)) from None
            claim_data(output_dir, data_identity(node, dataset, sources), node.allow_data_change)
            status.set("loading model")
            logger.info("loading model %s", node.model)
            model, tokenizer = load_model(node)
        status.set("joining swarm")
        # Not abandoned midway: a join cut short could leave its p2pd daemon behind.
        swarm = start_swarm(node, output_dir, model_name=args.swarm_model_name or model_label(node.model))
        stop.raise_if_requested()
        status.watch(swarm, rejoin_through=list(node.initial_peers), require_swarm=node.require_swarm)
        if node.wait_for_peers > 0:
            status.set(f"waiting for {node.wait_for_peers} peer(s)", patience=node.wait_for_peers_timeout + 60.0)
            with stop.abandonable("waiting for peers"):
                await_peers(swarm, node.wait_for_peers, node.wait_for_peers_timeout)
        status.set("starting training")
        metrics = MetricsJsonl(output_dir / "metrics.jsonl", resume_step=_step(resume))
        status.replay(metrics.history)
        trainer = SAPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            swarm=swarm,
            sources=sources,
            held_out_tasks=held_out_tasks,
            callbacks=[NodeProgress(), metrics, SwarmLog(), status, EvaluateAtEnd(), stop],
        )
        status.watch(
            swarm, lambda: trainer.sender_outcomes, rejoin_through=list(node.initial_peers),
            require_swarm=node.require_swarm,
        )  # fmt: skip
        registry = trainer.intake.sources
        registry.max_source_errors = node.max_source_errors
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        if resume is not None:
            logger.info("resuming from %s", resume)
        stop.raise_if_requested()
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        if stop.requested is None:
            trainer.save_model(str(output_dir / "final"))
            logger.info("finished %d steps; final model in %s", trainer.state.global_step, output_dir / "final")
        else:
            logger.info("stopped by %s at step %d", stop.requested, trainer.state.global_step)
        return 0
    except StopRequested as e:
        # Work in progress abandoned; the last completed step stays resumable (its checkpoint written if need be).
        if trainer is not None:
            stop.checkpoint_last_step(trainer)
        logger.info("stopped by %s at step %d", e, trainer.state.global_step if trainer is not None else 0)
        return 0
    except (RewardErrorLimit, SourceErrorLimit) as e:
        kind = "reward" if isinstance(e, RewardErrorLimit) else "task source"
        status.set(f"stopped: {kind} errors", stopped=str(e))
        flag = "max_reward_errors_in_a_row" if kind == "reward" else "max_source_errors"
        message = f"stopping: {e}; fix it and restart (the node resumes from its newest complete checkpoint; --{flag} "
        message += "raises the limit)"
        logger.error("%s", message)
        raise ErrorLimitReached(message) from None
    except KeyboardInterrupt:
        logger.warning("aborted: the current step is lost; the newest complete checkpoint is kept")
        return 130
    finally:
        stop.uninstall()
        if swarm is not None:
            logger.info("leaving the swarm")
            swarm.close()
        for handler in (problems, *log_handlers):
            logging.getLogger().removeHandler(handler)
            handler.close()
        if page is not None:
            page.close()


def start_status_page(node: NodeArguments, board: Any, status: Any) -> Any:
    """Serve the node's status page (a :class:`~sapo.node.web.StatusServer`), or None when it is off or its address
    cannot be bound (logged: the page never stops a node)."""
    from sapo.node.web import StatusServer, node_app

    if node.status_port is None:
        return None
    try:
        server = StatusServer(node_app(board.snapshot), node.status_host, node.status_port)
    except OSError as e:
        logger.warning("status page not served on %s:%s: %s", node.status_host, node.status_port, e)
        return None
    board.set_page_url(server.url)
    status.set("starting", page=server.url)
    exposure = "this machine only" if server.host in ("127.0.0.1", "localhost", "::1") else "OPEN TO THE NETWORK"
    logger.info("status page: %s (%s; JSON at status.json, Prometheus at metrics)", server.url, exposure)
    return server


def _step(checkpoint: Path | None) -> int | None:
    return int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint is not None else None


def _plain(value: Any) -> Any:
    """A JSON-comparable copy of a setting."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, os.PathLike):
        return str(value)
    return json.loads(json.dumps(value, default=str))
