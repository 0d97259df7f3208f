"""`sapo-node doctor`: one line per check with its fix; exit 1 when the node cannot run (an occupied port, a missing
model), 0 otherwise."""

from __future__ import annotations

import re
import socket
import time

import pytest

from sapo.node.cli import main

PEER_ID = "QmbHkbbrWMJXsY9Zm3stKpbmEgx5m5ZxSojoPSXZoGNypn"


def _lines(capsys) -> dict[str, list[str]]:
    """Printed check lines by check name."""
    by_name: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("ok", "info", "warn", "FAIL"):
            two_words = {"status": "status page", "initial": "initial peer", "output": "output dir"}
            name = "clock sync" if parts[1:3] == ["clock", "sync"] else two_words.get(parts[1], parts[1])
            by_name.setdefault(name, []).append(line)
    return by_name


def test_a_machine_that_can_run_the_node_passes_every_check(tmp_path, tiny_model_a, capsys):
    code = main(["doctor", "--model", str(tiny_model_a), "--output_dir", str(tmp_path / "out"), "--status_port", "0"])
    lines = _lines(capsys)
    assert code == 0, lines
    for name in ("python", "torch", "threads", "gpu", "model", "memory", "output dir", "p2pd", "listen", "clock sync"):
        assert name in lines, f"no {name} check in {sorted(lines)}"
    assert not any(line.startswith("FAIL") for found in lines.values() for line in found)
    assert "GiB available" in lines["memory"][0] and "needs about" in lines["memory"][0]


def test_an_occupied_listen_port_fails_and_an_answering_initial_peer_is_reported(tmp_path, tiny_model_a, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["doctor", "--model", str(tiny_model_a), "--output_dir", str(tmp_path / "out"),
                     "--host_maddrs", f"/ip4/127.0.0.1/tcp/{port}", "--status_port", "0",
                     "--initial_peers", f"/ip4/127.0.0.1/tcp/{port}/p2p/{PEER_ID}"])  # fmt: skip
    lines = _lines(capsys)
    assert code == 1
    (listen,) = lines["listen"]
    assert listen.startswith("FAIL") and str(port) in listen and "-> fix:" in listen and "another port" in listen
    assert any("answers on TCP" in line for line in lines["initial peer"])
    (clock,) = lines["clock"]  # a port that answers TCP but is no hivemind peer: said plainly
    assert clock.startswith("warn") and "offset not measured: cannot ask" in clock


def test_a_missing_model_and_a_malformed_announced_address_fail_with_their_fixes(tmp_path, capsys):
    code = main(["doctor", "--model", str(tmp_path / "nowhere"), "--output_dir", str(tmp_path / "out"),
                 "--announce_maddrs", "/ip4/1.2.3.4/tcp/notaport", "--status_port", "0"])  # fmt: skip
    lines = _lines(capsys)
    assert code == 1
    assert lines["model"][0].startswith("FAIL") and "does not exist" in lines["model"][0]
    assert lines["announce"][0].startswith("FAIL") and "malformed multiaddr" in lines["announce"][0]


def test_the_systemd_example_runs_doctor_and_the_node_with_valid_options():
    import shlex
    from pathlib import Path

    from sapo.node.options import parse_node_args

    unit = (Path(__file__).resolve().parents[1] / "examples" / "sapo-node.service").read_text()
    lines = dict(
        line.split("=", 1)
        for line in unit.replace("\\\n", " ").splitlines()
        if line.startswith(("ExecStart", "Restart"))
    )
    pre, start = shlex.split(lines["ExecStartPre"]), shlex.split(lines["ExecStart"])
    assert pre[1] == "doctor" and start[0].endswith("/sapo-node")
    args, node, _ = parse_node_args(start[1:])
    assert node.host_maddrs == ["/ip4/0.0.0.0/tcp/31337"] and args.output_dir == "/var/lib/sapo-node"
    assert lines["Restart"] == "on-failure" and lines["RestartPreventExitStatus"] == "2"  # 2: a configuration error
    parse_node_args(pre[2:])


# ----------------------------------------------------------------------------------------------------
# asking a peer: clock offset and wire version (a real hivemind peer on 127.0.0.1)


@pytest.fixture
def peer():
    """A swarm peer on 127.0.0.1 that has announced itself in the index; closed (with its p2pd) afterwards."""
    from swarm.dht import DHTTransport, DHTTransportConfig

    transport = DHTTransport(DHTTransportConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], model_name="tiny"))
    try:
        deadline = time.monotonic() + 30
        while transport.readout().counters.get("index_stores", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        yield transport
    finally:
        transport.close()


def test_doctor_measures_the_clock_offset_to_a_peer_and_reads_the_wire_version_it_announces(
    tmp_path, tiny_model_a, peer, capsys
):
    from swarm.records import WIRE_VERSION

    address = peer.visible_addresses()[0]
    code = main(["doctor", "--model", str(tiny_model_a), "--output_dir", str(tmp_path / "out"), "--status_port", "0",
                 "--initial_peers", address])  # fmt: skip
    lines = _lines(capsys)
    assert code == 0, lines
    (clock,) = lines["clock"]
    offset = re.search(r"^  ok  clock +([+-]\d+\.\d+) s \(± (\d+\.\d+) s\) to (\S+)$", clock)
    assert offset and abs(float(offset.group(1))) < 0.5 and offset.group(3) == address.rsplit("/p2p/", 1)[1], clock
    (wire,) = lines["wire"]
    assert wire.startswith("  ok") and f"the peer announces wire version {WIRE_VERSION}," in wire, wire


def test_doctor_fails_on_a_peer_whose_clock_is_five_seconds_ahead(tmp_path, tiny_model_a, peer, capsys, monkeypatch):
    import hivemind.dht.protocol

    real_time = hivemind.dht.protocol.get_dht_time
    monkeypatch.setattr(hivemind.dht.protocol, "get_dht_time", lambda: real_time() + 5.0)  # what the peer answers
    code = main(["doctor", "--model", str(tiny_model_a), "--output_dir", str(tmp_path / "out"), "--status_port", "0",
                 "--initial_peers", peer.visible_addresses()[0]])  # fmt: skip
    lines = _lines(capsys)
    (clock,) = lines["clock"]
    assert code == 1 and clock.startswith("FAIL") and re.search(r"clock +\+(4\.9\d|5\.0\d) s", clock), clock
    assert "more than 3 s apart refuse each other" in clock and "-> fix: synchronize the clocks" in clock


def test_doctor_says_plainly_when_no_peer_can_be_asked(tmp_path, tiny_model_a, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    code = main(["doctor", "--model", str(tiny_model_a), "--output_dir", str(tmp_path / "out"), "--status_port", "0",
                 "--initial_peers", f"/ip4/127.0.0.1/tcp/{port}/p2p/{PEER_ID}"])  # fmt: skip
    lines = _lines(capsys)
    assert code == 0  # a peer that is down is a warning: the node trains alone and keeps dialing
    assert lines["clock"] == ["info  clock          offset not measured: no initial peer answers"]
    assert lines["wire"] == ["info  wire           no initial peer answers"]


def test_a_peer_announcing_another_wire_version_fails_the_wire_check():
    import msgpack

    from sapo.node.doctor import FAIL, OK, _wire_check
    from sapo.node.peer_probe import PeerProbe, announced_entry

    entry = {"version": 2, "model": "m", "updated_at": 1.0, "records": [], "host": "QmPeer"}
    assert announced_entry(msgpack.packb(entry)) == {"version": 2, "host": "QmPeer"}  # of whatever version
    assert announced_entry(b"\xc1 torn") is None and announced_entry(msgpack.packb([1, 2])) is None
    other = _wire_check(PeerProbe("/ip4/1.2.3.4/tcp/1/p2p/QmPeer", peer_versions=[2], listed_versions={2: 1}), 1)
    assert other.status == FAIL and "announces wire version 2, this node speaks 1" in other.line()
    assert "sapo-node --version" in other.line()
    same = _wire_check(PeerProbe("/ip4/1.2.3.4/tcp/1/p2p/QmPeer", peer_versions=[1], listed_versions={1: 3}), 1)
    assert same.status == OK and "index: 3 at version 1" in same.line()
