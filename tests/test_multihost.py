"""Three hosts made with network namespaces and veth links to a bridge, one sapo-node per host.

Cut a host's link mid-run: the other two keep exchanging and training, and so does the cut-off node (alone);
restore it: exchange resumes. Kill the bootstrap peer: the nodes that had joined keep going. Needs root (or
CAP_NET_ADMIN) and iproute2; skipped with the reason where namespaces cannot be made. Traffic stays inside
the namespaces the test creates (10.231.0.0/24, no route out).
"""
# ruff: noqa: F811  (the started fixture imported from tests.node_fixtures is redefined as an argument)

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from sapo.node.warm_start import WarmProcess
from tests.node_fixtures import (  # noqa: F401
    NO_EVALUATION,
    PACED,
    _assert_gone,
    _metrics,
    _node_command,
    _p2pd,
    _wait,
    start_node,
    started,
)
from tests.swarm_fixtures import hosts  # noqa: F401

pytestmark = pytest.mark.slow


def _received(out: Path) -> float:
    rows = _metrics(out)
    return rows[-1].get("swarm/received_groups", 0.0) if rows else 0.0


def _step(out: Path) -> int:
    rows = _metrics(out)
    return rows[-1]["step"] if rows else 0


def _grows(outs: list[Path], read, what: str, timeout: float = 120) -> None:
    """Wait until ``read(out)`` grows for every ``out``."""
    before = {out: read(out) for out in outs}
    _wait(lambda: all(read(out) > before[out] for out in outs), timeout, what)


def _settles(out: Path, read, quiet: float, what: str, timeout: float = 120) -> None:
    """Wait until ``read(out)`` has not changed for ``quiet`` seconds."""
    last, since = read(out), time.monotonic()

    def quiet_enough() -> bool:
        nonlocal last, since
        value = read(out)
        if value != last:
            last, since = value, time.monotonic()
        return time.monotonic() - since >= quiet

    _wait(quiet_enough, timeout, what)


def test_three_hosts_survive_a_cut_link_and_the_bootstrap_peers_death(tmp_path, tiny_model_a, hosts, started):
    outs = [tmp_path / f"host{i}" for i in range(3)]
    p2pd = {}

    def start(i: int, initial_peers: list[str]) -> subprocess.Popen | WarmProcess:
        command = _node_command(
            tiny_model_a, outs[i], "--max_steps", "100000", "--save_steps", "100000",
            "--host_maddrs", f"/ip4/{hosts.address(i)}/tcp/0", "--swarm_name", "netns",
            "--seed", str(i), *NO_EVALUATION, *PACED, *(["--initial_peers", *initial_peers] if initial_peers else []),
        )  # fmt: skip
        log = open(tmp_path / f"host{i}.log", "w")
        # forked warm into host i's namespace (cold, `ip netns exec` execs the node): the node's PID either way
        node = start_node(command, netns=hosts.names[i], stdout=log, stderr=log)
        started.append(node)
        return node

    def joined(i: int, node: subprocess.Popen | WarmProcess) -> None:
        _wait(lambda: (outs[i] / "address.txt").exists(), 120, f"host{i} to join", node)
        p2pd[i] = _p2pd(outs[i])

    nodes = [start(0, [])]
    joined(0, nodes[0])
    bootstrap = (outs[0] / "address.txt").read_text().split()
    assert all(hosts.address(0) in a for a in bootstrap)  # it announces its own host's address, nothing else
    nodes += [start(i, bootstrap) for i in (1, 2)]  # both join through host 0 at once
    for i in (1, 2):
        joined(i, nodes[i])
    _grows(outs, _received, "every host to receive groups of the others", timeout=180)

    # host 2's cable is cut: 0 and 1 keep exchanging and training, 2 keeps training alone
    hosts.set_link(2, up=False)
    _grows(outs[:2], _received, "hosts 0 and 1 to keep exchanging while host 2 is cut off")
    _grows(outs, _step, "all three to keep training")
    # Host 2 may still take groups that others had stored on it (DHT replicas) before the cut; once those
    # are used up it receives nothing until the link is back.
    _settles(outs[2], _received, quiet=15, what="host 2 to use up what was stored on it before the cut")
    assert all(node.poll() is None for node in nodes)

    # the cable is back: host 2 exchanges again
    hosts.set_link(2, up=True)
    _grows([outs[2]], _received, "host 2 to receive again after its link came back", timeout=180)

    # the bootstrap peer dies (kill -9): hosts 1 and 2, which joined through it, keep exchanging
    nodes[0].send_signal(signal.SIGKILL)
    nodes[0].wait(timeout=30)
    _grows(outs[1:], _received, "hosts 1 and 2 to keep exchanging without the bootstrap peer", timeout=180)

    for node in nodes[1:]:
        node.send_signal(signal.SIGTERM)
    for node in nodes[1:]:
        assert node.wait(timeout=120) == 0
    for daemon in p2pd.values():
        _assert_gone(daemon)
