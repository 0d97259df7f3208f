"""`docker stop` (Docker's default 10 s grace) of the image's node in each phase: how long it took, the exit code, and
the newest complete checkpoint against the last completed step. Needs a Docker engine and a built image; run as root.

    python3 docker/stop_times.py [--image sapo-node] [--work /tmp/sapo-stop-times] [PHASE ...]

Each phase runs one container with no network (`--network none`: the node starts a swarm of its own, on the
container's loopback) and a fresh volume, waits for the phase by the node's own state (status.json, node.log and the
checkpoints in the volume), then runs `docker stop` and prints a markdown table row. Two phases hold the node in
place with the fault-injection variables the tests use (a pause in the optimizer step, before a checkpoint's
completion marker); `saving-full` trains full weights (`--lora-r 0`) and stops it while it writes their checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

SMALL = ["--max-completion-length", "16", "--dataset-size", "256", "--save-steps", "2", "--eval-strategy", "no"]
LONG = ["--max-completion-length", "96", "--dataset-size", "256", "--save-steps", "100", "--eval-strategy", "no"]
SILENT_PEER = "/ip4/127.0.0.1/tcp/9/p2p/QmXv6bGuuUmBVb5RZtN4zGbiMJ2NjuZfD4uBFT5GfRmHZL"  # nothing listens there


def status(volume: Path) -> dict:
    """The node's status.json ({} before it writes one)."""
    try:
        return json.loads((volume / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def last_step(volume: Path) -> int:
    """The last training step in metrics.jsonl (0 when none)."""
    path, step = volume / "metrics.jsonl", 0
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row.get("step"), int) and "eval/pass@1" not in row:
            step = max(step, row["step"])
    return step


def newest_complete(volume: Path) -> int | None:
    """The step of the newest checkpoint with its completion marker."""
    steps = [int(c.name.split("-")[1]) for c in volume.glob("checkpoint-*") if (c / "sapo-complete.json").is_file()]
    return max(steps) if steps else None


def _in_step(step: int, *phases: str) -> Callable[[Path], bool]:
    return lambda v: last_step(v) >= step - 1 and status(v).get("step") == step and status(v).get("phase") in phases


def _logged(text: str) -> Callable[[Path], bool]:
    return lambda v: (v / "node.log").exists() and text in (v / "node.log").read_text()


def _writing(volume: Path) -> bool:
    return any(not (c / "sapo-complete.json").exists() for c in volume.glob("checkpoint-*"))


def _after(seconds: float, ready: Callable[[Path], bool]) -> Callable[[Path], bool]:
    return lambda v: ready(v) and (time.sleep(seconds) or True)


# name: (node arguments, when to stop, environment)
PHASES: dict[str, tuple[list[str], Callable[[Path], bool], list[str]]] = {
    "importing": (SMALL, lambda v: time.sleep(2.0) or True, []),
    "loading": (SMALL, lambda v: status(v).get("phase") in ("building questions", "loading model"), []),
    "joining": (
        [*SMALL, "--initial-peers", SILENT_PEER, "--join-timeout", "120"],
        _after(3.0, lambda v: status(v).get("phase") == "joining swarm"),
        [],
    ),  # fmt: skip
    "waiting": (
        [*SMALL, "--wait-for-peers", "1", "--wait-for-peers-timeout", "600"],
        lambda v: str(status(v).get("phase", "")).startswith("waiting for"),
        [],
    ),  # fmt: skip
    "evaluating": (
        ["--max-completion-length", "96", "--dataset-size", "256", "--eval-questions", "64"],
        lambda v: status(v).get("phase") == "evaluating held-out questions",
        [],
    ),  # fmt: skip
    "generating": (LONG, _in_step(2, "generating"), []),
    "training": (LONG, _in_step(2, "training"), []),
    "optimizer": (SMALL, _logged("pausing 3 s in the optimizer step"), ["SAPO_FAULT_PAUSE_IN_OPTIMIZER_STEP=3"]),
    "saving": ([*SMALL, "--save-steps", "1"], _writing, ["SAPO_FAULT_PAUSE_BEFORE_MARKER=3"]),
    "saving-full": ([*SMALL, "--save-steps", "1", "--lora-r", "0"], _writing, []),
}


def stop_in_phase(name: str, image: str, work: Path) -> str:
    """Run the image's node until phase ``name``, `docker stop` it; returns the table row."""
    arguments, ready, environment = PHASES[name]
    volume = work / name
    shutil.rmtree(volume, ignore_errors=True)
    volume.mkdir(parents=True)
    os.chown(volume, 10001, 10001)  # the image's user
    container = f"sapo-stop-times-{name}"
    subprocess.run(["docker", "rm", "-f", container], capture_output=True)
    command = ["docker", "run", "-d", "--name", container, "--network", "none", "-v", f"{volume}:/data"]
    command += [f"--env={e}" for e in environment]
    command += [image, "--output-dir", "/data", "--host-maddrs", "/ip4/0.0.0.0/tcp/31337", *arguments]
    subprocess.run(command, check=True, capture_output=True)
    started, note = time.monotonic(), ""
    while not ready(volume):
        running = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container], capture_output=True)
        if running.stdout.strip() != b"true" or time.monotonic() - started > 1800:
            note = "never reached the phase; "
            break
        time.sleep(0.05)
    phase = status(volume).get("phase", "(no status.json yet)")
    sent = time.monotonic()
    subprocess.run(["docker", "stop", container], capture_output=True)
    took = time.monotonic() - sent
    state = json.loads(subprocess.run(["docker", "inspect", container], capture_output=True, text=True).stdout)[0]
    logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
    (work / f"{name}.log").write_text(logs.stdout + logs.stderr)
    subprocess.run(["docker", "rm", container], capture_output=True)
    said = [re.sub(r"^\S+ \S+ \w+ \S+: ", "", line) for line in (logs.stdout + logs.stderr).splitlines()]
    said = [line for line in said if re.search(r"SIGTERM|checkpoint written|while starting", line)]
    return (
        f"| {name} | {phase} | {took:.1f} s | {state['State']['ExitCode']} | {last_step(volume)} | "
        f"{newest_complete(volume)} | {note}{'; '.join(said)[:200]} |"
    )


def main() -> None:
    """Print the table for the phases given (default: all)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phases", nargs="*", metavar="PHASE", help=f"one of {', '.join(PHASES)} (default: all)")
    parser.add_argument("--image", default="sapo-node")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sapo-stop-times"))
    options = parser.parse_args()
    unknown = [p for p in options.phases if p not in PHASES]
    if unknown:
        parser.error(f"unknown phase {unknown[0]!r}; choose from {', '.join(PHASES)}")
    options.work.mkdir(parents=True, exist_ok=True)
    print("| phase | status.json at SIGTERM | `docker stop` took | exit code | last step | newest complete checkpoint "
          "| the node said |\n|---|---|---|---|---|---|---|", flush=True)  # fmt: skip
    for name in options.phases or list(PHASES):
        print(stop_in_phase(name, options.image, options.work), flush=True)


if __name__ == "__main__":
    main()
