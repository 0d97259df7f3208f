"""A running SAPO node: policy, questions, rewards, DHT swarm and SAPOTrainer, with checkpoints and metrics."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from sapo.node.arguments import NodeArguments, default_task_names  # noqa: F401  (importable from here, as before)
from sapo.node.errors import ErrorLimitReached, JoinError, NodeError  # noqa: F401  (importable from here, as before)
from sapo.node.user_code import user_reward, user_source  # noqa: F401  (user_source importable from here, as before)

logger = logging.getLogger(__name__)

# Figures that define a run: an output directory written under one set of them cannot be resumed under another.
_RUN_IDENTITY_FIELDS = (
    "model", "tasks", "dataset", "rewards", "lora_r", "num_local", "num_external", "num_generations", "seed",
    "lora_target_modules",
)  # fmt: skip


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
        name = node.dataset_label or Path(node.dataset).stem or "dataset"
        try:
            train, test = dataset_splits(node)
            source = DatasetSource(
                train, name, node.question_column, node.answer_column, columns=node.reward_columns,
                eval_fraction=node.eval_fraction, eval_data=test,
            )  # fmt: skip
        except (FileNotFoundError, ValueError, KeyError) as e:
            raise NodeError(str(e)) from None
        logger.info("questions: %s, %d held out for evaluation", source.describe(), len(source.held_out()))
        return source.rows(), [source]
    source = ReasoningGymSource(task_specs(node.tasks))
    return source.rows(size=node.dataset_size, seed=seed), [source]


def dataset_splits(node: NodeArguments) -> tuple[Any, Any]:
    """The data to train on and the test split held out for evaluation (None when there is none): a file is the train
    split; a folder written by save_to_disk gives `dataset_train_split`, and `dataset_test_split` where it has one."""
    path = Path(node.dataset)
    if not path.is_dir():
        return node.dataset, None
    from datasets import DatasetDict, load_from_disk

    data = load_from_disk(str(path))
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
    return [known[name] if name in known else user_reward(name, known) for name in names]


def load_model(node: NodeArguments) -> tuple[Any, Any]:
    """The policy and tokenizer, with LoRA adapters (on `lora_target_modules`, default every linear) when
    `lora_r > 0`."""
    from sapo.models import LoraSpec, load_policy

    lora = None
    if node.lora_r > 0:
        targets = {"target_modules": list(node.lora_target_modules)} if node.lora_target_modules else {}
        lora = LoraSpec(r=node.lora_r, alpha=node.lora_alpha, dropout=node.lora_dropout, **targets)
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
    from sapo.sources import SourceErrorLimit, SourceRegistry
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
            sources=SourceRegistry(sources, max_source_errors=node.max_source_errors),
            held_out_tasks=held_out_tasks,
            callbacks=[NodeProgress(), metrics, SwarmLog(), status, EvaluateAtEnd(), stop],
        )
        status.watch(
            swarm, lambda: trainer.sender_outcomes, rejoin_through=list(node.initial_peers),
            require_swarm=node.require_swarm,
        )  # fmt: skip
        registry = trainer.intake.sources  # its error count, for the page
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
