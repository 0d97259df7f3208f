"""A fake swarm peer for benchmarks: a DHT peer in its own process publishing realistic groups at a steady rate.

The groups are real reasoning-gym questions (rows of ``build_reasoning_gym_dataset`` with their provenance, so a
receiver's verification passes) with plausible completions of realistic length: some end with the right answer in
``<answer>`` tags, some with a wrong one, some run to the length limit without one.

    python -m benchmarks.feeder --interval 5 --num-generations 4 --max-chars 470

prints ``ADDR <multiaddr>`` once its peer runs, then publishes until SIGTERM. :class:`Feeder` starts and stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.harness import ROOT, children, cpu_seconds, stop_processes

_STEPS = (
    "Let me look at the question again: {q}.",
    "First I write down what is given: {w} and {v}.",
    "We need {w}, so I work it out step by step.",
    "Taking {w} and {v} together gives {n}.",
    "Checking again, {n} looks right for {w}.",
    "Hmm, maybe I should convert {w} first.",
    "So the intermediate result is {n}.",
    "Now combine it with {v}.",
)


def plausible_completion(question: str, answer: str, rng: random.Random, max_chars: int) -> str:
    """A completion that reasons about ``question`` and either ends with the right answer in ``<answer>`` tags
    (37.5 %), ends with a wrong one (37.5 %), or runs to the length limit without an answer (25 %, ``max_chars``
    characters: a clipped completion). Completions with an answer take 20-70 % of ``max_chars``. The default
    model at 128 tokens gave a mean of 66-68 tokens with 25 % clipped; these average about 75 tokens."""
    words = re.findall(r"[A-Za-z0-9/]+", question) or ["x"]
    ending = rng.random()
    chars = max_chars if ending >= 0.75 else int(max_chars * rng.uniform(0.2, 0.7))
    parts: list[str] = []
    while sum(len(p) + 1 for p in parts) < chars:
        snippet = " ".join(words[rng.randrange(len(words)) :][:8])
        parts.append(
            rng.choice(_STEPS).format(q=snippet, w=rng.choice(words), v=rng.choice(words), n=rng.randint(0, 999))
        )
    text = " ".join(parts)[:chars]
    if ending < 0.375:
        return f"{text}\n<answer>{answer}</answer>"
    if ending < 0.75:
        wrong = str(rng.randint(0, 999)) if answer != "0" else "1"
        return f"{text}\n<answer>{wrong}</answer>"
    return text


def make_feeder_groups(
    rows: Sequence[dict[str, Any]], start: int, count: int, num_generations: int, max_chars: int, rng: random.Random
) -> list[Any]:
    """``count`` groups built from dataset rows ``start, start + 1, ...`` (cyclic), with the rows' provenance,
    each of ``num_generations`` plausible completions of at most about ``max_chars`` characters."""
    from swarm.records import Group, provenance_from_wire

    groups = []
    now = time.time()
    for k in range(count):
        row = rows[(start + k) % len(rows)]
        question = next(m["content"] for m in row["prompt"] if m["role"] == "user")
        completions = [
            plausible_completion(question, str(row["answer"]), rng, max_chars) for _ in range(num_generations)
        ]
        groups.append(
            Group(
                group_id=f"feed-{start + k}",
                prompt=row["prompt"],
                completions=completions,
                provenance=provenance_from_wire(json.loads(row["provenance"])),
                metadata={"answer": str(row["answer"])},
                model="feeder",
                step=start + k,
                created_at=now,
            )
        )
    return groups


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The feeder process's options."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.feeder", description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between two publishes")
    parser.add_argument("--num-generations", type=int, default=4, help="completions per group")
    parser.add_argument("--max-chars", type=int, default=400, help="characters of a clipped completion")
    parser.add_argument("--groups-per-publish", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234, help="dataset and completion seed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Feeder process: bootstrap a DHT peer, print its address, publish groups every ``--interval`` s."""
    import logging

    from sapo.tasks import DEFAULT_TASKS, build_reasoning_gym_dataset
    from swarm.dht import DHTTransport, DHTTransportConfig

    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leave through the finally below
    rows = build_reasoning_gym_dataset(DEFAULT_TASKS, size=512, seed=args.seed).to_list()
    rng = random.Random(args.seed)
    swarm = DHTTransport(DHTTransportConfig(model_name="feeder"))
    try:
        print("ADDR", swarm.visible_addresses()[0], flush=True)
        published = 0
        while True:
            swarm.publish(
                make_feeder_groups(rows, published, args.groups_per_publish, args.num_generations, args.max_chars, rng)
            )
            published += args.groups_per_publish
            time.sleep(args.interval)
    finally:
        swarm.close()


class Feeder:
    """The feeder as a subprocess; ``address`` once started; ``close()`` stops it and its p2pd."""

    def __init__(self, num_generations: int, max_chars: int, interval: float, groups_per_publish: int = 4):
        cmd = [sys.executable, "-m", "benchmarks.feeder", "--interval", str(interval)]
        cmd += ["--num-generations", str(num_generations), "--max-chars", str(max_chars)]
        cmd += ["--groups-per-publish", str(groups_per_publish)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        try:
            self.address = self._read_address(timeout=120)
        except BaseException:
            self.close()
            raise

    def _read_address(self, timeout: float) -> str:
        box: list[str] = []

        def read() -> None:
            for line in self.proc.stdout:
                if line.startswith("ADDR "):
                    box.append(line.split()[1])
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if not box:
            raise RuntimeError(f"feeder gave no address within {timeout:.0f} s (exit code {self.proc.poll()})")
        return box[0]

    def cpu_seconds(self) -> float:
        """CPU seconds of the feeder and its p2pd so far."""
        return cpu_seconds(self.proc.pid) + sum(cpu_seconds(pid) for pid in children(self.proc.pid))

    def close(self) -> None:
        """Stop the feeder (SIGTERM, then SIGKILL) and the p2pd it leaves behind."""
        stop_processes([self.proc])


if __name__ == "__main__":
    main()
