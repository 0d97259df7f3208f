"""`sapo-node doctor`: one line per check with its fix; exit 1 when the node cannot run (an occupied port, a missing
model), 0 otherwise."""

from __future__ import annotations

import socket

from sapo.node.cli import main

PEER_ID = "QmbHkbbrWMJXsY9Zm3stKpbmEgx5m5ZxSojoPSXZoGNypn"


def _lines(capsys) -> dict[str, list[str]]:
    """Printed check lines by check name."""
    by_name: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("ok", "info", "warn", "FAIL"):
            name = "status page" if parts[1] == "status" else "initial peer" if parts[1] == "initial" else parts[1]
            by_name.setdefault(name, []).append(line)
    return by_name


def test_a_machine_that_can_run_the_node_passes_every_check(tmp_path, tiny_model_a, capsys):
    code = main(["doctor", "--model", str(tiny_model_a), "--output_dir", str(tmp_path / "out"), "--status_port", "0"])
    lines = _lines(capsys)
    assert code == 0, lines
    for name in ("python", "torch", "threads", "gpu", "model", "memory", "output", "p2pd", "listen"):
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
    assert "clock" in lines


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
