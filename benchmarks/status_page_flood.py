"""What a client asking a node's status page as fast as it can makes the node spend, against a base commit.

A node's page (`sapo.node.web`) reads its board's snapshot. Each code (a ``git worktree`` of ``--base``, and this
tree) serves the page of a long-running node's board (5,000 steps, 100 held-out evaluations, 200 senders) from a
process of its own on 127.0.0.1; ``--clients`` threads here ask one route as fast as the server answers for
``--seconds``, the codes alternating in each round. Reported per code and route: requests answered per second, the
server process's CPU seconds per second of the flood (a fraction of one core, taken from training), and CPU ms per
answered request:

    python -m benchmarks.status_page_flood --base bbd0acd

Writes ``status_page_flood.{json,md}`` into ``--output-dir`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, ROOT, base_worktree, record_lines, run_record, write_report

ROUTES = ("/", "/status.json", "/metrics")

SERVER = r"""
import json, random, resource, sys
from collections import Counter
from sapo.node.board import StatusBoard
from sapo.node.web import StatusServer, node_app

random.seed(0)
board = StatusBoard("flooded", max_steps=100_000, version="0", model="tiny")
for step in range(1, 5001):
    board.record_step(step, {"sapo/local_reward": random.random(), "sapo/external_reward": random.random(),
                             "sapo/external_groups": 4.0, "sapo/fill_ins": 1.0, "sapo/time/generation": 1.0})
    if step % 50 == 0:
        board.record_held_out(step, random.random(), 0.02, {f"task{i}": random.random() for i in range(10)})
board.record_senders({f"{i:016x}": Counter(taken=5, junk=3) for i in range(200)})
server = StatusServer(node_app(board.snapshot), "127.0.0.1", 0)
print(json.dumps({"port": server.port, "module": sys.modules["sapo.node.web"].__file__}), flush=True)
for line in sys.stdin:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime}), flush=True)
server.close()
"""


class PageServer:
    """A process of ``tree``'s code serving the long run's page; :meth:`cpu` reads its CPU seconds so far."""

    def __init__(self, tree: Path):
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER], cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        started = json.loads(self.process.stdout.readline())
        if not started["module"].startswith(str(tree)):
            raise RuntimeError(f"{tree}'s server imported {started['module']}")
        self.port = int(started["port"])

    def cpu(self) -> float:
        """CPU seconds (user + system) the server process has spent."""
        self.process.stdin.write("cpu\n")
        self.process.stdin.flush()
        return float(json.loads(self.process.stdout.readline())["cpu"])

    def close(self) -> None:
        """End the server process and wait for it."""
        self.process.stdin.close()
        self.process.wait(timeout=30)


def ask(port: int, route: str) -> bool:
    """One GET of ``route``; True when a whole 200 answer came (False: closed unanswered or another status)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"GET {route} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            head = sock.recv(64)
            while sock.recv(1 << 16):
                pass
    except OSError:
        return False
    return head.startswith(b"HTTP/1.0 200")


def flood(server: PageServer, route: str, clients: int, seconds: float) -> dict[str, float]:
    """``clients`` threads asking ``route`` for ``seconds``: answered requests per second and the server's CPU."""
    answered, refused = [0] * clients, [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        while time.monotonic() < stop:
            if ask(server.port, route):
                answered[i] += 1
            else:
                refused[i] += 1

    cpu_before, began = server.cpu(), time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall, cpu = time.monotonic() - began, server.cpu() - cpu_before
    return {
        "answered_per_s": sum(answered) / wall,
        "refused_per_s": sum(refused) / wall,
        "server_cores": cpu / wall,
        "cpu_ms_per_answer": 1000 * cpu / max(1, sum(answered)),
    }


def measure(trees: dict[str, Path], rounds: int, clients: int, seconds: float) -> dict[str, dict[str, Any]]:
    """Per code and route, the median over ``rounds`` of each figure, the codes alternating within a round."""
    samples: dict[str, dict[str, list[dict[str, float]]]] = {code: {r: [] for r in ROUTES} for code in trees}
    for _ in range(rounds):
        for code, tree in trees.items():
            server = PageServer(tree)
            try:
                for route in ROUTES:
                    samples[code][route].append(flood(server, route, clients, seconds))
            finally:
                server.close()
    return {
        code: {
            route: {key: sorted(s[key] for s in runs)[len(runs) // 2] for key in runs[0]} for route, runs in by.items()
        }
        for code, by in samples.items()
    }


def markdown(results: dict[str, dict[str, Any]]) -> list[str]:
    """The table: a row per code and route."""
    rows = ["| code | route | answered / s | closed unanswered / s | server's CPU (cores) | CPU ms per answer |"]
    rows.append("|---|---|---|---|---|---|")
    for code, by_route in results.items():
        for route, r in by_route.items():
            rows.append(
                f"| {code} | `{route}` | {r['answered_per_s']:.0f} | {r['refused_per_s']:.0f} | "
                f"{r['server_cores']:.2f} | {r['cpu_ms_per_answer']:.2f} |"
            )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Flood both codes' pages and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit whose page is compared")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every route and code (default 3)")
    parser.add_argument("--clients", type=int, default=8, help="client threads asking at once (default 8)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds each flood lasts (default 3)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    record = run_record(" ".join(["python -m benchmarks.status_page_flood", *(argv or sys.argv[1:])]))
    with base_worktree(args.base) as base_tree:
        results = measure({f"base {args.base}": base_tree, "this tree": ROOT}, args.rounds, args.clients, args.seconds)
    data = {**record, "base": args.base, "rounds": args.rounds, "clients": args.clients, "results": results}
    lines = [
        "# What a client flooding the status page costs the node",
        "",
        *record_lines(record),
        "",
        f"{args.clients} client threads asking one route over and over for {args.seconds:g} s, against a server "
        "process holding a long run's board (5,000 steps, 100 evaluations, 200 senders); the median of "
        f"{args.rounds} rounds, the codes alternating in each. The clients run on this machine and share its cores.",
        "",
        *markdown(results),
    ]
    write_report(args.output_dir, "status_page_flood", data, lines)
    print("\n".join(lines))
    return data


if __name__ == "__main__":
    main()
