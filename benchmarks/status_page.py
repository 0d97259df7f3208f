"""Does the status page slow training? Step time of a tiny node with and without a client polling its page.

Runs ``sapo-node`` (a tiny random model with SmolLM2's tokenizer, alone, no held-out evaluation so every step is
alike) four times, in the order quiet, polled, polled, quiet; while a run is "polled", this process requests
``/``, ``/status.json`` and ``/metrics`` back to back (``--poll-interval`` apart), far more often than a browser
(every 10 s) or Prometheus (every 15-60 s) would. Step times are the differences of consecutive metrics.jsonl
timestamps, the first ``--warmup`` steps left out. Then (unless ``--no-screenshot``) a 2-node ``local-swarm``
runs a few steps and headless Chromium (Debian's ``chromium``) takes a screenshot of node-0's page and of the
swarm page.

Usage:
    python -m benchmarks.status_page                 # about 4-5 minutes on 2 cores
    python -m benchmarks.status_page --steps 10 --no-screenshot

Writes ``status_page.{json,md}`` (and ``node_status_page.png``, ``local_swarm_status_page.png``) into
``--output-dir`` (default benchmarks/results). Every process started is stopped, also on failure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, run_record, stop_processes, write_report

TINY = [
    "--num_local", "1", "--num_external", "1", "--num_generations", "2", "--per_device_train_batch_size", "4",
    "--max_completion_length", "8", "--dataset_size", "64", "--tasks", "basic_arithmetic",
]  # fmt: skip
ORDER = ("quiet", "browser", "hammered", "hammered", "browser", "quiet")
"""Runs in ABCCBA order, so that a drift of the machine's speed over the benchmark falls on every condition alike."""


def tiny_model(directory: Path) -> Path:
    """A tiny random Llama with SmolLM2's real tokenizer, saved under ``directory``."""
    from sapo.models import load_smollm2_tokenizer, save_tiny_model

    return save_tiny_model(directory / "tiny", load_smollm2_tokenizer(), seed=0)


def node_command(model: Path, out: Path, steps: int, *extra: str) -> list[str]:
    """A tiny node's command line, its page on a free port of 127.0.0.1."""
    return [sys.executable, "-m", "sapo.node.cli", "--model", str(model), "--output_dir", str(out), *TINY,
            "--max_steps", str(steps), "--save_steps", "100000", "--status_port", "0", *extra]  # fmt: skip


def page_url(out: Path) -> str | None:
    """The node's page address from its status.json, once written."""
    try:
        return json.loads((out / "status.json").read_text()).get("page")
    except (OSError, ValueError):
        return None


def step_ends(out: Path) -> list[float]:
    """Wall-clock times of the training lines of metrics.jsonl."""
    return [json.loads(line)["time"] for line in (out / "metrics.jsonl").read_text().splitlines()]


class Poller(threading.Thread):
    """Requests the page, its JSON and its metrics in turn, ``interval`` s apart, until stopped; keeps each request's
    end time, duration and success."""

    def __init__(self, out: Path, interval: float):
        super().__init__(daemon=True)
        self.out, self.interval = out, interval
        self.stop = threading.Event()
        self.requests: list[tuple[float, float, bool]] = []

    def run(self) -> None:
        while not self.stop.is_set() and page_url(self.out) is None:
            time.sleep(0.2)
        url = page_url(self.out)
        while not self.stop.is_set():
            for path in ("", "status.json", "metrics"):
                started = time.monotonic()
                try:
                    with urllib.request.urlopen(url + path, timeout=10) as response:
                        response.read()
                    ok = True
                except OSError:
                    ok = False  # e.g. after the node left: only failures during training count
                self.requests.append((time.time(), time.monotonic() - started, ok))
                time.sleep(self.interval)


def timed_run(model: Path, out: Path, args: argparse.Namespace, condition: str) -> dict[str, Any]:
    """One node run; unless ``condition`` is "quiet", a client polls its page throughout."""
    command = node_command(model, out, args.steps, "--eval_strategy", "no")
    interval = {"quiet": None, "browser": args.browser_interval, "hammered": args.hammer_interval}[condition]
    poller = Poller(out, interval) if interval is not None else None
    node = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(out.parent / f"{out.name}.log", "w"))
    try:
        if poller:
            poller.start()
        code = node.wait(timeout=600)
    finally:
        if poller:
            poller.stop.set()
            poller.join(timeout=15)
        stop_processes([node], grace=60)
    if code != 0:
        raise RuntimeError(f"node exited with {code}; see {out.parent / f'{out.name}.log'}")
    ends = step_ends(out)
    steps = [b - a for a, b in zip(ends, ends[1:], strict=False)][args.warmup :]
    run = {"condition": condition, "median_step_seconds": statistics.median(steps), "step_seconds": steps}
    if poller:
        during = [(seconds, ok) for end, seconds, ok in poller.requests if ends[args.warmup] <= end <= ends[-1]]
        answered = [seconds for seconds, ok in during if ok]
        run.update(
            poll_interval=interval, requests=len(answered), failed_requests=len(during) - len(answered),
            requests_per_second=len(answered) / max(ends[-1] - ends[args.warmup], 1e-9),
            mean_request_seconds=statistics.mean(answered) if answered else None,
        )  # fmt: skip
    return run


def chromium_screenshot(url: str, path: Path, profile: Path) -> None:
    """A headless Chromium screenshot of ``url`` (offline flags: no background networking, no updates)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--window-size=1100,1300", f"--screenshot={path}"]  # fmt: skip
    subprocess.run([browser, *flags, url], check=True, capture_output=True, timeout=120)


def screenshots(model: Path, work: Path, out_dir: Path, steps: int) -> list[str]:
    """A 2-node local swarm; screenshots of node-0's page and of the swarm page near its end."""
    run_dir = work / "swarm"
    port = _free_port()
    command = [sys.executable, "-m", "sapo.node.cli", "local-swarm", "--peers", "2", "--run-dir", str(run_dir),
               "--status-port", str(port), "--model", str(model), *TINY, "--max_steps", str(steps),
               "--save_steps", "100000", "--eval_steps", "3", "--eval_questions", "8"]  # fmt: skip
    swarm = subprocess.Popen(command, stdout=open(work / "swarm.log", "w"), stderr=subprocess.STDOUT)
    try:
        metrics = run_dir / "node-0" / "metrics.jsonl"
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and swarm.poll() is None:
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            if sum('"eval/pass@1"' not in line for line in lines) >= steps - 3:
                break
            time.sleep(1)
        node_url = page_url(run_dir / "node-0")
        if node_url is None or swarm.poll() is not None:
            raise RuntimeError(f"the local swarm ended or never served a page; see {work / 'swarm.log'}")
        chromium_screenshot(node_url, out_dir / "node_status_page.png", work / "profile")
        chromium_screenshot(f"http://127.0.0.1:{port}/", out_dir / "local_swarm_status_page.png", work / "profile")
    finally:
        stop_processes([swarm], grace=120)
    return ["node_status_page.png", "local_swarm_status_page.png"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="steps per timed run")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of a run left out")
    parser.add_argument(
        "--browser-interval",
        type=float,
        default=1.0,
        help="seconds between two requests of the 'browser' client (a browser refreshes every 10 s)",
    )
    parser.add_argument("--hammer-interval", type=float, default=0.02,
                        help="seconds between two requests of the 'hammered' client (a worst case)")  # fmt: skip
    parser.add_argument("--no-screenshot", action="store_true", help="skip the local swarm and its screenshots")
    parser.add_argument("--screenshot-steps", type=int, default=9, help="steps of the screenshot's local swarm")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    record = run_record()
    with tempfile.TemporaryDirectory(prefix="status-page-") as tmp:
        work = Path(tmp)
        model = tiny_model(work)
        runs = [timed_run(model, work / f"run-{i}-{kind}", args, kind) for i, kind in enumerate(ORDER)]
        images = [] if args.no_screenshot else screenshots(model, work, args.output_dir, args.screenshot_steps)

    medians = {c: statistics.median([s for r in runs if r["condition"] == c for s in r["step_seconds"]]) for c in ORDER}
    data = {**record, "settings": {k: v for k, v in vars(args).items() if k != "output_dir"}, "runs": runs,
            "median_step_seconds": medians, "images": images}  # fmt: skip
    lines = [
        "# Status page overhead: step time of a tiny node with and without a client polling its page",
        "",
        f"Command: `{record['command']}`  ",
        f"Commit: `{record['git_commit']}`, {record['date']}, {record['machine']}",
        "",
        f"Tiny random Llama (SmolLM2 tokenizer), alone, {args.steps} steps per run, the first {args.warmup} step "
        f"times left out, no held-out evaluation; runs in the order {', '.join(ORDER)}. A polled run is requested "
        f"`/`, `/status.json` and `/metrics` in turn by a separate process: 'browser' every {args.browser_interval} s "
        f"(ten times a browser's refresh), 'hammered' every {args.hammer_interval} s (a worst case). Only requests "
        "made while the node trained are counted.",
        "",
        "| run | client | median step (s) | requests answered | failed | requests/s | mean request (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs):
        polled = r["condition"] != "quiet"
        ms = f"{1000 * r['mean_request_seconds']:.1f}" if polled and r["mean_request_seconds"] else "-"
        rate = f"{r['requests_per_second']:.1f}" if polled else "-"
        lines.append(f"| {i} | {r['condition']} | {r['median_step_seconds']:.3f} | {r.get('requests', '-')} | "
                     f"{r.get('failed_requests', '-')} | {rate} | {ms} |")  # fmt: skip
    quiet = medians["quiet"]
    lines += [
        "",
        "Median step over the runs of each client: "
        + "; ".join(f"{c} {medians[c]:.3f} s (x{medians[c] / quiet:.3f} of quiet)" for c in dict.fromkeys(ORDER))
        + ".",
    ]
    if images:
        lines += ["", "Screenshots (headless Chromium, a 2-node local swarm): " + ", ".join(images)]
    paths = write_report(args.output_dir, "status_page", data, lines)
    print("\n".join(lines))
    print(f"wrote {paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
