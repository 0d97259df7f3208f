"""A node's questions and rewards: the data, task source and reward functions its options name, checked before any
model loads, and the record of what the run trains on in node-run.json."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from sapo.node.arguments import NodeArguments
from sapo.node.errors import NodeError
from sapo.node.user_code import user_module

logger = logging.getLogger(__name__)

SOURCE_REWARD = "source"
"""The reward name `--rewards source`: the `--source`'s own reward (a verifiers taskset's reward hooks)."""

# TRL's column names for what a node calls the question and the answer (TRL's `prompt`/`solution` datasets).
_TRL_COLUMNS = {"question": "prompt", "answer": "solution"}


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


def build_questions(node: NodeArguments, seed: int, eval_size: int = 1) -> tuple[Any, list[Any]]:
    """The node's training rows (a `datasets.Dataset`) and the task sources it holds: your own task source, your own
    dataset, or the reasoning-gym task mix. A source's rows and held-out rows (the first ``eval_size``) are checked
    here, so that one that returns something else is refused now (one line), not after the swarm started."""
    from sapo.sources import DatasetSource, ReasoningGymSource, load_records

    if node.source:
        if node.dataset:
            raise NodeError("give --source or --dataset, not both (a source class can read your data itself)")
        source = user_source(node.source, node.source_args, node.eval_fraction)
        rows = _source_rows(node.source, source, "rows", size=node.dataset_size, seed=seed)
        _source_rows(node.source, source, "held_out", eval_size)
        logger.info("questions: %s, %d training rows", source.describe(), len(rows))
        return rows, [source]
    if node.dataset:
        name = node.dataset_label or Path(node.dataset).stem or "dataset"
        try:
            train, test = dataset_splits(node)
            train = load_records(train) if isinstance(train, str) else train  # read once, its columns looked at
            question, answer = _columns_of(node, train)
            source = DatasetSource(
                train, name, question, answer, columns=node.reward_columns, eval_fraction=node.eval_fraction,
                eval_data=test,
            )  # fmt: skip
        except (FileNotFoundError, ValueError, KeyError) as e:
            raise NodeError(str(e).strip("'\"")) from None
        logger.info("questions: %s, %d held out for evaluation", source.describe(), len(source.held_out()))
        return source.rows(), [source]
    source = ReasoningGymSource(task_specs(node.tasks))
    return source.rows(size=node.dataset_size, seed=seed), [source]


def _source_rows(spec: str, source: Any, method: str, *args: Any, **offered: Any) -> Any:
    """``source.rows(...)`` or ``source.held_out(...)`` as a Dataset (a list of dicts converted); NodeError (one line)
    when it raises or returns anything else."""
    from sapo.sources import as_dataset

    call = getattr(source, method)
    try:
        return as_dataset(call(*args, **_accepted(call, offered)), f"source {spec}: {method}()")
    except TypeError as e:
        if str(e).startswith(f"source {spec}: "):
            raise NodeError(str(e)) from None
        raise NodeError(f"source {spec}: {method}() raised TypeError: {e}") from None
    except Exception as e:
        raise NodeError(f"source {spec}: {method}() raised {type(e).__name__}: {e}") from None


def _columns_of(node: NodeArguments, data: Any) -> tuple[str, str]:
    """The question and answer columns of ``data``: as given, or TRL's `prompt` / `solution` where the data has no
    column of the default name (`question` / `answer`) but has TRL's."""
    columns = getattr(data, "column_names", None)
    if columns is None:  # records: the first one says
        columns = list(data[0]) if data else []
    chosen = []
    for role, given in (("question", node.question_column), ("answer", node.answer_column)):
        trl = _TRL_COLUMNS[role]
        chosen.append(trl if given == role and role not in columns and trl in columns else given)
    return chosen[0], chosen[1]


def dataset_splits(node: NodeArguments) -> tuple[Any, Any]:
    """The data to train on and the test split held out for evaluation (None when there is none): a file is the train
    split; a folder (written by save_to_disk, or of data files named by split as TRL's local form) gives
    `dataset_train_split`, and `dataset_test_split` where it has one."""
    path = Path(node.dataset)
    if not path.is_dir():
        return node.dataset, None
    from datasets import DatasetDict

    from sapo.sources.dataset import load_folder

    data = load_folder(path)
    if not isinstance(data, DatasetDict):  # one Dataset: the train split
        return data, None
    if node.dataset_train_split not in data:
        raise NodeError(
            f"{path}: no split {node.dataset_train_split!r} (splits: {', '.join(data)}); choose one with "
            "--dataset_train_split"
        )
    test = data[node.dataset_test_split] if node.dataset_test_split in data else None
    if node.dataset_test_split == node.dataset_train_split:
        test = None
    return data[node.dataset_train_split], test


def user_source(spec: str, arguments: dict[str, Any] | str | None, eval_fraction: float = 0.1) -> Any:
    """The task source `spec` names (`module:Class` or `path/to/file.py:Class`), built with ``arguments`` (a mapping,
    or JSON text): a `sapo.sources.TaskSource` subclass, or a `verifiers.v1.Taskset` subclass (its config built from
    ``arguments``, held as a `VerifiersSource` with ``eval_fraction`` of its tasks held out). Raises NodeError saying
    what is wrong."""
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
    module = user_module(where, f"--source {spec!r}", "sapo_user_source")
    cls = getattr(module, name, None)
    if inspect.isclass(cls) and _is_taskset(cls):
        return _verifiers_source(spec, cls, arguments or {}, eval_fraction)
    if not (inspect.isclass(cls) and issubclass(cls, TaskSource)):
        raise NodeError(
            f"--source {spec!r}: {where} has no sapo.sources.TaskSource subclass {name!r} (nor a verifiers.v1.Taskset "
            "subclass of that name)"
        )
    try:
        return cls(**(arguments or {}))
    except Exception as e:
        raise NodeError(f"--source {spec!r}: {name}(**source_args) raised {type(e).__name__}: {e}") from None


def _is_taskset(cls: type) -> bool:
    """Whether ``cls`` is a verifiers taskset class (checked without importing verifiers where it is not loaded)."""
    import sys

    verifiers = sys.modules.get("verifiers.v1")
    return verifiers is not None and issubclass(cls, verifiers.Taskset)


def _verifiers_source(spec: str, cls: type, arguments: dict[str, Any], eval_fraction: float) -> Any:
    """A verifiers taskset class as a task source: ``cls(Config(**arguments))``, its config class the one the taskset
    declares (`Taskset[Task, Config]`)."""
    from verifiers.v1 import Taskset, TasksetConfig
    from verifiers.v1.utils.generic import concrete_type

    from sapo.sources import VerifiersSource

    config_cls = concrete_type(cls, TasksetConfig, origin=Taskset) or TasksetConfig
    try:
        taskset = cls(config_cls(**arguments))
    except Exception as e:
        detail = " ".join(str(e).split())[:300]
        raise NodeError(f"--source {spec!r}: {cls.__name__}({config_cls.__name__}(**source_args)) raised "
                        f"{type(e).__name__}: {detail}") from None  # fmt: skip
    try:
        return VerifiersSource(taskset, eval_fraction=eval_fraction)
    except (TypeError, ValueError) as e:
        raise NodeError(f"--source {spec!r}: {e}") from None


def _accepted(func: Any, offered: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``offered`` that ``func``'s signature takes by name."""
    import inspect

    parameters = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return offered
    return {k: v for k, v in offered.items() if k in parameters}


def build_rewards(names: list[str], source: Any = None) -> list[Any]:
    """Reward functions by name, your own as `module:function` / `path/to/file.py:function`, or `source`: the reward
    of the task ``source`` (its `reward` attribute, as a verifiers taskset's). With ``source`` None, `source` is only
    checked to be the reward of a source to come (the node names its rewards before it builds the source)."""
    from rewards import format_reward, math_reward, reasoning_gym_reward

    known = {"reasoning_gym": reasoning_gym_reward, "math": math_reward, "format": format_reward}
    if not names:
        raise NodeError(f"no reward function given; choose from {sorted(known)} or name your own as module:function")
    funcs = []
    for name in names:
        if name == SOURCE_REWARD:
            funcs.append(_source_reward(source))
        else:
            funcs.append(known[name] if name in known else _user_reward(name, known))
    return funcs


def _source_reward(source: Any) -> Any:
    if source is None:
        return None
    reward = getattr(source, "reward", None)
    if not callable(reward):
        raise NodeError(
            f"--rewards {SOURCE_REWARD}: {source.describe()} has no reward of its own (a `reward` attribute); name a "
            "reward function instead"
        )
    return reward


def _user_reward(spec: str, known: dict[str, Any]) -> Any:
    """The function `spec` names (`module:function` or `file.py:function`), checked to be callable."""

    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise NodeError(f"unknown reward function {spec!r}; choose from {sorted(known)}, {SOURCE_REWARD} (the "
                        "--source's own), or name your own as module:function or path/to/file.py:function")  # fmt: skip
    module = user_module(where, f"reward {spec!r}", "sapo_user_rewards")
    function = getattr(module, name, None)
    if not callable(function):
        raise NodeError(f"reward {spec!r}: {where} has no function {name!r}")
    return function


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
    # The label under the key runs recorded it as (`dataset_name`, its name before TRL's meaning), so they resume.
    split = {"eval_fraction": node.eval_fraction, "question_column": node.question_column,
             "answer_column": node.answer_column, "reward_columns": node.reward_columns,
             "dataset_name": node.dataset_label}  # fmt: skip
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
