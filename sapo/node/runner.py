"""A running SAPO node: policy, questions, rewards, DHT swarm and SAPOTrainer, with checkpoints and metrics."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from sapo.node.arguments import NodeArguments, default_task_names, trl_argument_notes  # noqa: F401  (as before)
from sapo.node.data import (  # noqa: F401  (importable from here, as before)
    SOURCE_REWARD,
    build_questions,
    build_rewards,
    claim_data,
    data_identity,
    dataset_splits,
    task_specs,
    user_source,
)
from sapo.node.errors import ErrorLimitReached, JoinError, NodeError, refuse  # noqa: F401  (importable, as before)

logger = logging.getLogger(__name__)

# Figures that define a run: an output directory written under one set of them cannot be resumed under another.
_RUN_IDENTITY_FIELDS = (
    "model", "tasks", "dataset", "rewards", "lora_r", "num_local", "num_external", "num_generations", "seed",
    "lora_target_modules",
)  # fmt: skip

# Seconds the node gives its swarm transport to leave gracefully before p2pd is killed: with the checkpoint and the
# process's exit, a stop fits in `docker stop`'s default 10 s grace.
LEAVE_TIMEOUT = 3.0

# ----------------------------------------------------------------------------------------------------
# building the parts


def load_model(node: NodeArguments, use_cpu: bool = False) -> tuple[Any, Any]:
    """The policy and tokenizer, with LoRA adapters (on `lora_target_modules`, default every linear) when
    `lora_r > 0`; loaded in `dtype` on a GPU (float32 on a CPU) and with `attn_implementation` where this machine has
    it (TRL's `ModelConfig` meaning)."""
    import torch

    from sapo.models import LoraSpec, load_policy
    from sapo.speed.patch_point import attention_implementation

    lora = None
    if node.lora_r > 0:
        targets = {"target_modules": list(node.lora_target_modules)} if node.lora_target_modules else {}
        lora = LoraSpec(r=node.lora_r, alpha=node.lora_alpha, dropout=node.lora_dropout, **targets)
    dtype = None  # load_policy's choice: float32 on a CPU, the checkpoint's on a GPU
    if node.dtype is not None:
        if use_cpu or not torch.cuda.is_available():
            if node.dtype != "float32":
                logger.info("--dtype %s: on a CPU the weights stay float32 (bf16 compute follows --bf16)", node.dtype)
        else:
            dtype = "auto" if node.dtype == "auto" else getattr(torch, node.dtype)
    try:
        model, tokenizer = load_policy(None if node.model == "default" else node.model, lora=lora, dtype=dtype)
    except (FileNotFoundError, ValueError, ModuleNotFoundError, OSError) as e:
        raise NodeError(str(e)) from None
    if node.attn_implementation is not None:
        try:
            model.set_attn_implementation(node.attn_implementation)
        except (ImportError, ValueError, AttributeError) as e:
            logger.warning(
                "--attn_implementation %s is not available here (%s); the model keeps %s", node.attn_implementation,
                " ".join(str(e).split())[:160], attention_implementation(model) or "its default",
            )  # fmt: skip
    return model, tokenizer


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
        rejoin_interval=node.rejoin_interval,
        rejoin_max_interval=node.rejoin_max_interval,
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
    try:
        addresses = swarm.visible_addresses()
        (output_dir / "address.txt").write_text("\n".join(addresses) + "\n")
        peer_id = addresses[0].rsplit("/p2p/", 1)[-1] if addresses else "-"
        print(
            f"\nsapo-node {peer_id} (key fingerprint {swarm.peer_id}) is in swarm {node.swarm_name!r}. Others join "
            "it with:", file=sys.stderr,
        )  # fmt: skip
        print(f"  sapo-node --initial-peers {' '.join(addresses)}\n", file=sys.stderr, flush=True)
        if not node.announce_maddrs and any(a.startswith(("/ip4/0.0.0.0/", "/ip6/::/")) for a in node.host_maddrs):
            print(
                "  These are the addresses this machine sees. Behind NAT or in a container others cannot dial them: "
                "pass --announce_maddrs /ip4/PUBLIC_IP/tcp/PORT (the address and published port they reach) and "
                "this node prints that.\n", file=sys.stderr, flush=True,
            )  # fmt: skip
    except BaseException:  # a stop now (the join is abandonable): the caller never gets the transport to close
        swarm.close(timeout=LEAVE_TIMEOUT)
        raise
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
    from sapo.checkpoints import write_atomically

    if marker.exists():
        previous = json.loads(marker.read_text())
        # A setting the record lacks (a run of an earlier version) is added, not compared: that run resumes.
        changed = {k: (previous[k], v) for k, v in identity.items() if k in previous and previous[k] != v}
        if changed:
            detail = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
            raise NodeError(
                f"output directory {output_dir} belongs to a run with a different config ({detail}); "
                "use another --output-dir, or restore that config to resume it"
            )
        if identity.keys() - previous.keys():
            write_atomically(marker, json.dumps({**identity, **previous}, indent=1, sort_keys=True))
        return
    write_atomically(marker, json.dumps(identity, indent=1, sort_keys=True))


def quiet_library_progress_bars() -> None:
    """The node shows one progress bar (its steps); the libraries' load/save bars would interleave with it."""
    import datasets
    import transformers

    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


# ----------------------------------------------------------------------------------------------------
# running


def run_node(args: Any, node: NodeArguments) -> int:
    """Run one node until `max_steps` or a signal; returns the process exit code. A refusal (:class:`NodeError`) is
    one line on stderr, in node.log and in status.json (:func:`sapo.node.errors.refuse`)."""
    try:
        return _run(args, node)
    except NodeError as e:
        return refuse(e, args.output_dir)


def _run(args: Any, node: NodeArguments) -> int:
    from transformers.integrations import TensorBoardCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from sapo.checkpoints import latest_complete_checkpoint, set_aside_incomplete
    from sapo.collector import freeze_long_lived, thaw
    from sapo.node.about import model_label, sapo_version
    from sapo.node.board import BoardLogHandler, StatusBoard
    from sapo.node.callbacks import (
        RESTING,
        EvaluateAtEnd,
        GracefulStop,
        MetricsJsonl,
        NodeProgress,
        NodeStatus,
        StepPace,
        StopRequested,
        SwarmLog,
    )
    from sapo.node.logs import setup_logging
    from sapo.node.tensorboard_files import TensorBoardFiles
    from sapo.reward_guard import RewardErrorLimit, RewardGuard, check_reward_columns
    from sapo.sources import SourceErrorLimit, SourceRegistry
    from sapo.trainer import SAPOTrainer

    # Cheap checks first: a typo must not cost a model load.
    check_addresses(node)
    try:
        guard = RewardGuard(node.max_reward_errors_in_a_row, node.max_reward_error_rate)
    except ValueError as e:
        raise NodeError(f"--max_reward_errors_in_a_row / --max_reward_error_rate: {e}") from None
    if SOURCE_REWARD in node.rewards and not node.source:
        raise NodeError(f"--rewards {SOURCE_REWARD} is the reward of a --source (a verifiers taskset's, say): give one")
    build_rewards(node.rewards)  # each one found now; the source's own once the source is built
    if not node.dataset and not node.source:
        task_specs(node.tasks)
    held_out_tasks = task_specs(node.eval_tasks) if node.eval_tasks else None
    output_dir = Path(args.output_dir)
    claim_output_dir(output_dir, run_identity(args, node))
    # Removed on the way out: a caller in the same process (a script, a test) keeps no handler on a closed stream.
    log_handlers = setup_logging(output_dir, args.log_level if args.log_level not in ("passive", None) else "info")
    quiet_library_progress_bars()
    for note in trl_argument_notes(node):
        logger.info("%s", note)

    stop = GracefulStop().install()
    board = StatusBoard(
        node_name=f"sapo-node {output_dir.name}", max_steps=args.max_steps, version=sapo_version(),
        model=model_label(node.model), min_step_seconds=node.min_step_seconds,
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
            dataset, sources = build_questions(node, seed=args.seed, eval_size=args.eval_questions)
            reward_funcs = guard.wrap_all(build_rewards(node.rewards, sources[0]))
            try:
                check_reward_columns(reward_funcs, dataset.column_names)
            except ValueError as e:
                raise NodeError(str(e)) from None
            claim_data(output_dir, data_identity(node, dataset, sources), node.allow_data_change)
            status.set("loading model")
            logger.info("loading model %s", node.model)
            model, tokenizer = load_model(node, use_cpu=bool(args.use_cpu))
        freeze_long_lived()  # the swarm's teardown collects garbage: milliseconds, not seconds
        status.set("joining swarm")
        # Abandoned midway: the transport kills the p2pd it started (one caught starting exits on its idle timeout).
        with stop.abandonable("joining the swarm"):
            swarm = start_swarm(node, output_dir, model_name=args.swarm_model_name or model_label(node.model))
        status.watch(swarm, rejoin_through=list(node.initial_peers), require_swarm=node.require_swarm)
        if node.wait_for_peers > 0:
            status.set(f"waiting for {node.wait_for_peers} peer(s)", patience=node.wait_for_peers_timeout + 60.0)
            with stop.abandonable("waiting for peers"):
                await_peers(swarm, node.wait_for_peers, node.wait_for_peers_timeout)
        status.set("starting training")
        metrics = MetricsJsonl(output_dir / "metrics.jsonl", resume_step=_step(resume))
        status.replay(metrics.history)
        if resume is not None and args.eval_on_start and metrics.evaluated(_step(resume)):
            logger.info("step %d's held-out evaluation is in metrics.jsonl already: not run again", _step(resume))
            args.eval_on_start = False
        trainer = SAPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            swarm=swarm,
            sources=SourceRegistry(sources, max_source_errors=node.max_source_errors),
            held_out_tasks=held_out_tasks,
            # The stop first: a phase is abandonable before the status page shows it (a SIGTERM sent on seeing
            # "evaluating" abandons the evaluation), and before the pace's rest.
            callbacks=[stop, NodeProgress(), metrics, SwarmLog(), status, EvaluateAtEnd()]
            + (
                [StepPace(node.min_step_seconds, on_rest=lambda _rest: status.set(RESTING))]
                if node.min_step_seconds
                else []
            ),
        )
        status.watch(
            swarm, lambda: trainer.sender_outcomes, rejoin_through=list(node.initial_peers),
            require_swarm=node.require_swarm,
        )  # fmt: skip
        registry = trainer.intake.sources  # its error count, for the page
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        for callback in list(trainer.callback_handler.callbacks):
            if isinstance(callback, TensorBoardCallback):  # --report_to tensorboard: its files kept bounded
                trainer.add_callback(TensorBoardFiles(callback))
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
        flag = (
            "max_source_errors"
            if kind != "reward"
            else {"max_error_rate": "max_reward_error_rate"}.get(e.limit, "max_reward_errors_in_a_row")
        )
        message = f"stopping: {e}; fix it and restart (the node resumes from its newest complete checkpoint; --{flag} "
        message += "raises the limit)"
        logger.error("%s", message)
        raise ErrorLimitReached(message, recorded=True) from None
    except KeyboardInterrupt:
        logger.warning("aborted: the current step is lost; the newest complete checkpoint is kept")
        return 130
    except NodeError:
        raise  # a refusal: run_node says it, in one line
    except Exception as e:  # not foreseen: the traceback in node.log too, and the status says the node stopped
        logger.exception("stopping on an unexpected error: %s: %s", type(e).__name__, e)
        status.set("stopped: error", stopped=f"{type(e).__name__}: {e}")
        return 1
    finally:
        stop.finishing()  # its handlers stay until the end: a second SIGTERM does not cut the leaving short
        try:
            if swarm is not None:
                logger.info("leaving the swarm")
                swarm.close(timeout=LEAVE_TIMEOUT)
            for handler in (problems, *log_handlers):
                logging.getLogger().removeHandler(handler)
                handler.close()
            if page is not None:
                page.close()
        finally:
            stop.uninstall()
            thaw()


def start_status_page(node: NodeArguments, board: Any, status: Any) -> Any:
    """Serve the node's status page (a :class:`~sapo.node.web.StatusServer`), or None when it is off or its address
    cannot be bound (logged: the page never stops a node)."""
    from sapo.node.web import StatusServer, node_app

    if node.status_port is None:
        return None
    try:
        instance = secrets.token_hex(8)  # this process's page, told from another node's on the same port later
        server = StatusServer(node_app(board.snapshot, instance), node.status_host, node.status_port)
    except OSError as e:
        logger.warning("status page not served on %s:%s: %s", node.status_host, node.status_port, e)
        return None
    board.set_page_url(server.url)
    status.set("starting", page=server.url, instance=instance)
    exposure = "this machine only" if server.host in ("127.0.0.1", "localhost", "::1") else "OPEN TO THE NETWORK"
    logger.info("status page: %s (%s; JSON at status.json, Prometheus at metrics)", server.url, exposure)
    return server


def run_identity(args: Any, node: NodeArguments) -> dict[str, Any]:
    """The settings that define a run, as node-run.json records them: the model, rewards and shape of a round, and the
    questions as given: reasoning-gym `tasks` (not recorded for a `dataset` or `source` run, which does not use
    them), `dataset`, or `source` with its `source_args`."""
    identity = {k: _plain(getattr(node if hasattr(node, k) else args, k)) for k in _RUN_IDENTITY_FIELDS}
    if node.dataset or node.source:
        del identity["tasks"]
    arguments = node.source_args
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # refused when the source is built
    identity.update(source=node.source, source_args=_plain(arguments))
    return identity


def _step(checkpoint: Path | None) -> int | None:
    return int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint is not None else None


def _plain(value: Any) -> Any:
    """A JSON-comparable copy of a setting."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, os.PathLike):
        return str(value)
    return json.loads(json.dumps(value, default=str))
