"""`sapo-node local-swarm`: N node processes on 127.0.0.1 that find each other, outputs in one run directory."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sapo.node.processes import stop_processes
from sapo.node.report import is_evaluation_line
from sapo.node.runner import NodeError
from sapo.node.status import read_status
from sapo.node.warm_start import WarmProcess, WarmStarter, start_node_process


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Own options, and the rest passed to every node unchanged."""
    parser = argparse.ArgumentParser(
        prog="sapo-node local-swarm",
        description="Start N sapo-node processes on 127.0.0.1 that form one swarm. Options not listed here "
        "(e.g. --max-steps 5, --model DIR, --config node.yaml) are passed to every node.",
    )
    parser.add_argument("--peers", type=int, default=3, help="number of nodes (default 3)")
    parser.add_argument(
        "--run-dir", default=None, help="directory for every node's output (default runs/local-swarm-TIME)"
    )
    parser.add_argument("--seed", type=int, default=42, help="seed of node 0; node i uses seed + i")
    parser.add_argument("--status-interval", type=float, default=15.0, help="seconds between status lines")
    parser.add_argument(
        "--node-config",
        action="append",
        default=[],
        metavar="YAML",
        help="a config file for one node: the i-th given goes to node i, cycling when there are fewer than --peers; "
        "it replaces a --config passed to every node (peers that differ: task specialists, other models or ranks)",
    )
    parser.add_argument(
        "--status-port",
        type=int,
        default=31338,
        help="port of the swarm's status page on 127.0.0.1 (one row, link and plot line per node; each node serves "
        "its own page on a free port); a taken port falls back to a free one; -1 serves none",
    )
    args, node_args = parser.parse_known_args(argv)
    if args.peers < 1:
        parser.error(f"--peers must be at least 1, got {args.peers}")
    missing = [config for config in args.node_config if not Path(config).is_file()]
    if missing:
        parser.error(f"--node-config: no such file: {', '.join(missing)}")
    return args, node_args


def node_command(
    index: int,
    run_dir: Path,
    seed: int,
    node_args: list[str],
    initial_peers: list[str],
    peers: int,
    config: str | None = None,
) -> list[str]:
    """The command line of node ``index`` of ``peers``: each waits for the others before its first step
    (unless the node options say otherwise), so that no node trains alone while the others load. ``config``: this
    node's own config file, in place of any ``--config`` in ``node_args``."""
    if config is not None:
        node_args = [*without_option(node_args, "--config"), "--config", config]
    given = {arg.split("=", 1)[0].replace("-", "_") for arg in node_args if arg.startswith("--")}
    waiting = [] if "__wait_for_peers" in given else ["--wait_for_peers", str(peers - 1)]
    page = [] if "__status_port" in given else ["--status_port", "0"]  # N pages on one machine: free ports
    command = [
        sys.executable, "-m", "sapo.node.cli", *node_args,
        "--output_dir", str(run_dir / f"node-{index}"),
        "--seed", str(seed + index),
        "--host_maddrs", "/ip4/127.0.0.1/tcp/0",
        *waiting,
        *page,
        "--initial_peers", *initial_peers,
    ]  # fmt: skip
    return command


def without_option(argv: list[str], name: str) -> list[str]:
    """``argv`` without the option ``name`` and its value (``--name VALUE`` or ``--name=VALUE``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(f"{name}="):
            out.append(arg)
    return out


def start_bootstrap_peer(run_dir: Path, node_args: list[str]) -> Any:
    """A model-less DHT peer in this process that every node joins. It keeps the swarm, and the records
    stored on it, alive while nodes start, finish or restart at different times."""
    from sapo.node.options import parse_node_args
    from swarm.dht import DHTTransport, DHTTransportConfig

    _, node, _ = parse_node_args(node_args)  # fail fast on bad node options, before any process starts
    return DHTTransport(
        DHTTransportConfig(
            swarm_name=node.swarm_name,
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
            identity_path=str(run_dir / "bootstrap" / "identity.key"),
            state_dir=str(run_dir / "bootstrap"),
            model_name="bootstrap",
            announce=False,  # it relays records but trains nothing: nodes must not count it as a peer
            prefetch_groups=1,  # it never trains: keep its cache (and fetch traffic) minimal
        )
    )


def last_metrics(path: Path) -> dict[str, Any]:
    """The newest training line of a node's metrics.jsonl, or {}."""
    return latest_metrics(path)[0]


def latest_metrics(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The newest training line and the newest held-out evaluation line of a node's metrics.jsonl ({} if none)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}, {}
    train: dict[str, Any] = {}
    held_out: dict[str, Any] = {}
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if is_evaluation_line(record):
            held_out = held_out or record
        else:
            train = train or record
        if train and held_out:
            break
    return train, held_out


def status_line(run_dir: Path, count: int) -> str:
    """One line: what each node is doing now (its status file), and its latest reward, held-out pass@1, groups
    taken from the others and peers seen (its metrics)."""
    parts = []
    for i in range(count):
        node_dir = run_dir / f"node-{i}"
        status = read_status(node_dir)
        doing = status.get("phase", "starting (loading libraries)")
        if status.get("step"):
            doing = f"step {status['step']} {doing}"
        if status.get("swarm") == "alone":
            doing += " (alone)"
        train, held_out = latest_metrics(node_dir / "metrics.jsonl")
        figures = []
        if train:
            figures.append(f"reward {train.get('sapo/local_reward', float('nan')):.3f}")
        if held_out:
            figures.append(f"held-out {held_out['eval/pass@1']:.3f}")
        if train:
            figures.append(
                f"taken {int(train.get('sapo/total/external_groups', 0))} peers {int(train.get('sapo/peers', 0))}"
            )
        parts.append(f"node-{i}: {doing}" + (f" ({', '.join(figures)})" if figures else ""))
    return " | ".join(parts)


def node_snapshots(run_dir: Path, count: int, timeout: float = 2.0) -> list[dict[str, Any]]:
    """Each node's name, page address (from its status.json) and /status.json snapshot (None while it starts or
    when it does not answer within ``timeout`` seconds)."""
    import urllib.request

    nodes = []
    for i in range(count):
        url = read_status(run_dir / f"node-{i}").get("page")
        snapshot = None
        if url:
            try:
                with urllib.request.urlopen(url + "status.json", timeout=timeout) as response:
                    snapshot = json.load(response)
            except (OSError, ValueError):
                snapshot = None
        nodes.append({"name": f"node-{i}", "url": url, "snapshot": snapshot})
    return nodes


def start_swarm_page(run_dir: Path, count: int, port: int) -> Any:
    """Serve local-swarm's page (every node's row, link and plot lines) on 127.0.0.1, or None when off."""
    from sapo.node.page import swarm_page
    from sapo.node.web import StatusServer

    if port < 0:
        return None

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        nodes = node_snapshots(run_dir, count)
        if environ.get("PATH_INFO") == "/status.json":
            body, kind = json.dumps(nodes).encode(), "application/json"
        else:
            body, kind = swarm_page(nodes).encode(), "text/html; charset=utf-8"
        start_response("200 OK", [("Content-Type", kind), ("Content-Length", str(len(body)))])
        return [body]

    try:
        server = StatusServer(app, "127.0.0.1", port)
    except OSError as e:
        print(f"local-swarm: status page not served: {e}", flush=True)
        return None
    print(f"local-swarm: status page of all nodes: {server.url}", flush=True)
    return server


def shared_cores_env(nodes: int) -> dict[str, str]:
    """This process's environment for ``nodes`` node processes sharing the machine's cores: an equal share of math
    threads each (``OMP_NUM_THREADS``, unless set), since oversubscribed threads spend their time switching."""
    from sapo.speed.threads import usable_cores

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // nodes)))
    return env


def main(argv: list[str]) -> int:
    """Run the local swarm until every node exits; returns 0 when all of them exited 0."""
    args, node_args = parse_args(argv)
    run_dir = Path(args.run_dir or f"runs/local-swarm-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = shared_cores_env(args.peers)
    # The nodes share one environment: their libraries are imported once, not per node (by the server of a program
    # that started this one, where it shares one).
    starter = WarmStarter.shared() or WarmStarter(env)
    starter.prepare()
    processes: list[subprocess.Popen | WarmProcess] = []
    logs = []

    def start(index: int, initial_peers: list[str]) -> subprocess.Popen | WarmProcess:
        out_dir = run_dir / f"node-{index}"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "address.txt").unlink(missing_ok=True)
        log = open(out_dir / "node.out", "ab")
        logs.append(log)
        config = args.node_config[index % len(args.node_config)] if args.node_config else None
        command = node_command(index, run_dir, args.seed, node_args, initial_peers, args.peers, config)
        process = start_node_process(command, starter=starter, stdout=log, stderr=subprocess.STDOUT, env=env)
        processes.append(process)
        print(f"local-swarm: node-{index} started (pid {process.pid}), output in {out_dir}", flush=True)
        return process

    stopping: list[str] = []  # the signals received: no node is started after one

    def forward(signum: int, frame: Any) -> None:
        stopping.append(signal.Signals(signum).name)
        print(f"local-swarm: {stopping[-1]}: asking every node to checkpoint and leave", flush=True)
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    bootstrap = None
    page = None
    try:
        bootstrap = start_bootstrap_peer(run_dir, node_args)
        page = start_swarm_page(run_dir, args.peers, args.status_port)
        address = bootstrap.visible_addresses()
        print(f"local-swarm: swarm address {' '.join(address)}", flush=True)
        for i in range(args.peers):
            if stopping:  # a signal during start-up: the nodes not yet started are not started
                print(f"local-swarm: {stopping[0]} before node-{i} started: starting no more nodes", flush=True)
                break
            start(i, address)
        last_status = 0.0
        while any(p.poll() is None for p in processes):
            if time.monotonic() - last_status > args.status_interval:
                print(f"local-swarm: {status_line(run_dir, args.peers)}", flush=True)
                last_status = time.monotonic()
            time.sleep(0.5)
        print(f"local-swarm: done. {status_line(run_dir, args.peers)}", flush=True)
        codes = [p.returncode for p in processes]
        for i, code in enumerate(codes):
            if code != 0:
                print(
                    f"local-swarm: node-{i} exited with code {code}; see {run_dir / f'node-{i}' / 'node.out'}",
                    flush=True,
                )
        print(f"local-swarm: outputs in {run_dir}; plot them with: sapo-node report {run_dir}", flush=True)
        return 0 if all(code == 0 for code in codes) and not stopping else 1
    except (RuntimeError, NodeError) as e:
        print(f"local-swarm: error: {e}", file=sys.stderr, flush=True)
        return 2 if isinstance(e, NodeError) else 1
    finally:
        stop_processes(processes, grace=120)  # every node we started is stopped, by its PID, whatever happened
        starter.close()
        for log in logs:
            log.close()
        if bootstrap is not None:
            bootstrap.close()
        if page is not None:
            page.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
