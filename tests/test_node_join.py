"""A node whose bootstrap peer is down trains alone, joins the bootstrap node once it comes up at that address (same
identity and port) and takes its groups, without a restart; when that peer leaves, it trains alone again. Real
sapo-node processes and hivemind peers on 127.0.0.1, always stopped by PID."""
# ruff: noqa: F811  (the started fixture imported from tests.node_fixtures is redefined as an argument)

from __future__ import annotations

import json
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

from tests.node_fixtures import (
    NO_EVALUATION,
    PACED,
    _assert_gone,
    _metrics,
    _node_command,
    _p2pd,
    _wait,
    start_node,
    started,  # noqa: F401 (a fixture)
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(out: Path) -> dict:
    try:
        return json.loads((out / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _taken(out: Path) -> float:
    rows = _metrics(out)
    return rows[-1].get("sapo/total/external_groups", 0.0) if rows else 0.0


def _page(out: Path) -> dict:
    with urllib.request.urlopen(_status(out)["page"] + "status.json", timeout=10) as response:
        return json.load(response)


def test_a_node_with_a_dead_bootstrap_peer_trains_then_joins_it_when_it_comes_up(tmp_path, tiny_model_a, started):
    from swarm.dht import DHTTransport

    # The bootstrap node's address is known before it runs: its identity and port, as a user passes them around.
    port = _free_port()
    boot_out = tmp_path / "bootstrap"
    boot_out.mkdir()
    listen = f"/ip4/127.0.0.1/tcp/{port}"
    probe = DHTTransport(identity_path=str(boot_out / "identity.key"), host_maddrs=[listen])
    address = probe.visible_addresses()
    probe.close()

    out = tmp_path / "node"
    node = start_node(
        _node_command(tiny_model_a, out, "--max_steps", "100000", "--save_steps", "100000", "--seed", "1",
                      "--join_timeout", "5", "--rejoin_max_interval", "5", "--status_port", "0", *NO_EVALUATION,
                      *PACED, "--initial_peers", *address),
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "node.log", "w"),
    )  # fmt: skip
    started.append(node)
    _wait(lambda: len(_metrics(out)) >= 2, 300, "the node to train alone", node)
    assert _status(out)["swarm"] == "alone" and _taken(out) == 0
    page = _page(out)
    assert page["health"]["status"] == "degraded" and address[0] in page["health"]["problems"][0]
    log = (tmp_path / "node.log").read_text()
    assert "no initial peer answered: training alone" in log
    assert "pacing: each step starts at least 2 s after the previous one began" in log

    boot = start_node(
        _node_command(tiny_model_a, boot_out, "--max_steps", "100000", "--save_steps", "100000", "--seed", "2",
                      "--host_maddrs", listen, "--status_port", "0", *NO_EVALUATION, *PACED),
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "bootstrap.log", "w"),
    )  # fmt: skip
    started.append(boot)
    _wait(lambda: _taken(out) > 0, 400, "the node to join the bootstrap node and take its groups", node)
    assert boot.poll() is None and (boot_out / "address.txt").read_text().split() == address
    assert _status(out)["swarm"] == "joined" and _page(out)["health"]["status"] == "ok"
    assert any(s.get("taken", 0) > 0 for s in _page(out)["senders"].values())
    assert "joined the swarm" in (tmp_path / "node.log").read_text()

    # every peer leaves mid-run: the node keeps training, alone, and says so
    boot_p2pd = _p2pd(boot_out)
    boot.send_signal(signal.SIGTERM)
    assert boot.wait(timeout=300) == 0
    _assert_gone(boot_p2pd)
    _wait(lambda: _status(out).get("swarm") == "alone", 180, "the node to notice it is alone", node)
    steps = len(_metrics(out))
    _wait(lambda: len(_metrics(out)) > steps + 1, 120, "the node to keep training alone", node)

    p2pd = _p2pd(out)
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=300) == 0
    _assert_gone(p2pd)


def test_a_node_given_an_announce_address_tells_others_that_address(tmp_path, capsys):
    """In a container (or behind NAT) the addresses a node sees are not the ones others reach: given
    --announce_maddrs, the command it prints and address.txt name that address (with the port it listens on
    published there) and nothing else."""
    from sapo.node.arguments import NodeArguments
    from sapo.node.runner import start_swarm

    announced = f"/ip4/192.0.2.7/tcp/{_free_port()}"  # documentation range: written down, never dialled here
    node = NodeArguments(host_maddrs=["/ip4/127.0.0.1/tcp/0"], announce_maddrs=[announced], join_timeout=30)
    swarm = start_swarm(node, tmp_path, model_name="tiny")
    try:
        addresses = (tmp_path / "address.txt").read_text().split()
        assert len(addresses) == 1 and addresses[0].startswith(announced + "/p2p/")
        said = capsys.readouterr().err
        assert f"sapo-node --initial-peers {addresses[0]}\n" in said and "--announce_maddrs" not in said
    finally:
        swarm.close()
