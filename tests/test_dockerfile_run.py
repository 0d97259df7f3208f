"""What the community-node image runs keeps what its users rely on: the node's console script as a non-root user,
writing to the volume, listening on the exposed port, answering its HEALTHCHECK as /healthz does, given time to
checkpoint by `docker stop`; and the README's `docker run` line agrees with all of that. The Dockerfile is read with
`dockerfile-parse` (no Docker engine runs here), as tests/test_dockerfile.py reads how the image is built.
"""

# ruff: noqa: F811  (the fixtures imported from tests.dockerfile_fixtures are redefined as arguments)
from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import PurePosixPath

from tests.dockerfile_fixtures import ROOT, _values, final_stage, image_env, instructions  # noqa: F401

# ----------------------------------------------------------------------------------------------------
# helpers


def _index(stage: list[dict], instruction: str) -> int:
    found = [n for n, i in enumerate(stage) if i["instruction"] == instruction]
    assert found, f"the Dockerfile's final stage has no {instruction}"
    return found[-1]


def _exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"use the exec (JSON) form, got {value!r}"
    return parsed


def _cmd(stage) -> list[str]:
    return _exec_form(_values(stage, "CMD")[-1])


def _spelled(name: str, old: str, new: str) -> str:
    """``name`` with ``old`` separators as ``new`` after its leading dashes (`--host-maddrs` <-> `--host_maddrs`)."""
    body = name.lstrip("-")
    return name[: len(name) - len(body)] + body.replace(old, new)


def _option(args: list[str], *names: str) -> list[str]:
    """Every value of a command-line option (`--name value` or `--name=value`; dashes or underscores)."""
    # the leading dashes stay: only the words' separators may be dashes or underscores
    spellings = {s for name in names for s in (name, _spelled(name, "-", "_"), _spelled(name, "_", "-"))}
    values = []
    for n, arg in enumerate(args):
        key, eq, val = arg.partition("=")
        if arg in spellings and n + 1 < len(args):
            values.append(args[n + 1])
        elif eq and key in spellings:
            values.append(val)
    return values


def _tcp_port(maddr: str) -> int | None:
    match = re.search(r"/tcp/(\d+)", maddr)
    return int(match.group(1)) if match else None


def _volume(stage) -> str:
    volumes = _values(stage, "VOLUME")
    assert volumes, "the image declares no VOLUME for the identity key and checkpoints"
    value = volumes[-1]
    paths = json.loads(value) if value.startswith("[") else value.split()
    assert len(paths) == 1, f"expected one volume, got {paths}"
    return paths[0]


def _exposed_port(stage) -> int:
    exposed = [p for value in _values(stage, "EXPOSE") for p in value.split()]
    assert len(exposed) == 1, f"expected one exposed port, got {exposed}"
    port, _, proto = exposed[0].partition("/")
    assert proto in ("", "tcp"), f"the swarm port is TCP, got {exposed[0]}"
    return int(port)


# ----------------------------------------------------------------------------------------------------
# what the image runs


def test_entrypoint_is_the_console_script(final_stage, image_env):
    entrypoint = _exec_form(_values(final_stage, "ENTRYPOINT")[-1])
    assert entrypoint == ["sapo-node"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "sapo-node" in scripts, "ENTRYPOINT names a console script pyproject.toml does not define"
    # The console script lands in the venv's bin directory, which must be on PATH.
    path = image_env.get("PATH", "")
    venv = image_env.get("VIRTUAL_ENV")
    assert venv and f"{venv}/bin" in path.split(":")


def test_runs_as_a_non_root_user(final_stage):
    user_at = _index(final_stage, "USER")
    assert user_at < _index(final_stage, "ENTRYPOINT"), "USER must come before ENTRYPOINT"
    user = final_stage[user_at]["value"].split(":")[0].strip()
    assert user not in ("root", "0", ""), f"the node must not run as root, got USER {user!r}"
    created = " ".join(_values(final_stage, "RUN"))
    assert re.search(rf"\buseradd\b[^&]*\b{re.escape(user)}\b", created), f"user {user!r} is never created"


def test_the_node_writes_to_the_volume(final_stage, image_env):
    volume = _volume(final_stage)
    cmd = _cmd(final_stage)
    assert _option(cmd, "--output-dir") == [volume], "the default command must write to the volume"
    # Arguments to `docker run IMAGE ...` replace CMD: a relative output dir then still lands in the volume.
    workdir = final_stage[_index(final_stage, "WORKDIR")]["value"]
    assert workdir == volume
    # The volume belongs to the node's user (a named volume copies the image's ownership).
    user = final_stage[_index(final_stage, "USER")]["value"].split(":")[0]
    assert any(re.search(rf"chown\s+{user}\S*\s+{re.escape(volume)}\b", run) for run in _values(final_stage, "RUN"))
    # The baked-in model must not sit under the volume, which would hide it.
    cache = image_env.get("SAPO_CACHE_DIR", "")
    assert cache and not PurePosixPath(cache).is_relative_to(volume)


def test_exposed_port_is_where_the_node_listens(final_stage):
    port = _exposed_port(final_stage)
    host_maddrs = _option(_cmd(final_stage), "--host-maddrs")
    assert host_maddrs, "the default command must listen beyond loopback (--host-maddrs)"
    assert all(m.startswith("/ip4/0.0.0.0/") or m.startswith("/ip6/::/") for m in host_maddrs)
    assert {_tcp_port(m) for m in host_maddrs} == {port}


def _healthcheck(final_stage) -> list[str]:
    checks = _values(final_stage, "HEALTHCHECK")
    assert checks, "the image has no HEALTHCHECK"
    return _exec_form(checks[-1].split("CMD", 1)[1].strip())


def test_healthcheck_asks_the_nodes_own_healthz(final_stage):
    """One meaning of healthy: the HEALTHCHECK runs the node's console script's `health` command, which asks the
    node's /healthz; no script of its own."""
    argv = _healthcheck(final_stage)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv[:2] == ["sapo-node", "health"] and scripts["sapo-node"] == "sapo.node.cli:main"
    assert not list((ROOT / "docker").glob("health*")), "a second definition of healthy is back in docker/"


def test_docker_scripts_are_valid_bash():
    scripts = sorted((ROOT / "docker").glob("*.sh"))
    assert scripts, "docker/ holds no script"
    for script in scripts:
        assert script.read_text().startswith("#!/usr/bin/env bash"), f"{script.name} needs a bash shebang"
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"bash -n {script.name}: {result.stderr}"
    import sys

    for script in sorted((ROOT / "docker").glob("*.py")):  # run by a host's python3: the standard library only
        result = subprocess.run([sys.executable, "-I", str(script), "--help"], capture_output=True, text=True)
        assert result.returncode == 0 and "usage:" in result.stdout, f"{script.name} --help: {result.stderr}"


# ----------------------------------------------------------------------------------------------------
# the README's instructions


def _readme_docker_section() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## Docker\b.*?(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, "README.md has no '## Docker' section"
    return match.group(0)


def _commands(section: str, prefix: str) -> list[list[str]]:
    """The shell commands of `section` starting with `prefix`, backslash continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", section)
    return [shlex.split(line.strip()) for line in joined.splitlines() if line.strip().startswith(prefix)]


def test_readme_docker_run_line_matches_the_image(final_stage):
    """The README's `docker run` line (and docs/docker.md's first, the same) runs the image `docker build` tags with
    its volume and port, and gives others a reachable node: the address it announces is the published port, and its
    status page is published on the host's loopback (inside the container the page must listen on the container's
    interface for Docker to forward to it; everywhere else its default stays 127.0.0.1)."""
    from sapo.node.arguments import NodeArguments

    section = _readme_docker_section()
    runs = _commands(section, "docker run")
    assert runs, "the README's Docker section has no `docker run` line"
    docs_runs = _commands((ROOT / "docs" / "docker.md").read_text(), "docker run")
    assert docs_runs and docs_runs[0] == runs[0], "docs/docker.md's first `docker run` line is the README's"
    run = runs[0]
    volume, port = _volume(final_stage), _exposed_port(final_stage)
    page_port, page_host = NodeArguments.status_port, NodeArguments.status_host
    assert page_host == "127.0.0.1", "outside Docker the status page stays on this machine"
    assert not _option(_cmd(final_stage), "--status-host"), "the image's default command keeps the page on loopback"

    mounts = [v.split(":") for v in _option(run, "-v", "--volume")]
    assert any(len(m) >= 2 and m[1] == volume for m in mounts), f"`docker run` must mount a volume on {volume}"
    published = [p.split(":") for p in _option(run, "-p", "--publish")]
    to_port = [p for p in published if p[-1].split("/")[0] == str(port)]
    assert to_port, f"`docker run` must publish the container's port {port}"
    host_port = int(to_port[0][-2]) if len(to_port[0]) >= 2 else port
    to_page = [p for p in published if p[-1] == str(page_port)]
    assert to_page and to_page[0][0] == "127.0.0.1" and len(to_page[0]) == 3, (
        f"`docker run` must publish the status page on the host's loopback: -p 127.0.0.1:{page_port}:{page_port}"
    )

    # Arguments after the image replace the image's CMD, so a line that passes any must repeat the listening
    # address (else the node listens on loopback only), and its announced address must be the published port.
    builds = _commands(section, "docker build")
    image = _option(builds[0], "-t", "--tag")[0] if builds else None
    assert image and image in run, f"`docker run` must run the image `docker build` tags ({image})"
    node_args = run[run.index(image) + 1 :]
    host_maddrs = _option(node_args, "--host-maddrs")
    assert host_maddrs and {_tcp_port(m) for m in host_maddrs} == {port}, (
        f"`docker run` passes node arguments, so it must also pass --host-maddrs /ip4/0.0.0.0/tcp/{port}"
    )
    output_dirs = _option(node_args, "--output-dir")
    assert output_dirs and all(PurePosixPath(d).is_relative_to(volume) for d in output_dirs)
    announced = _option(node_args, "--announce-maddrs")
    assert announced and all(_tcp_port(m) == host_port for m in announced), (
        f"announce this machine's address with the published port {host_port}, got {announced}"
    )
    assert _option(node_args, "--status-host") == ["0.0.0.0"], "the published page must listen on 0.0.0.0 inside"
    if "--build-arg" in section:
        assert "DEVICE=cuda" in section, "the README's build argument for the CUDA image is DEVICE=cuda"


def test_the_healthcheck_and_healthz_agree_on_a_running_a_stalled_and_a_stopped_node(final_stage, tmp_path):
    """The image's HEALTHCHECK command, run as Docker runs it (in the volume, the node's output directory), against a
    node's real page server: healthy while steps end, unhealthy once no step ended for the stall limit (the page
    still answers, with 503), unhealthy once the node is gone (nothing answers)."""
    import sys
    import urllib.error
    import urllib.request

    from sapo.node.board import STALL_MIN_SECONDS, StatusBoard
    from sapo.node.status import write_status
    from sapo.node.web import StatusServer, node_app

    now = [1_800_000_000.0]
    board = StatusBoard("a node", max_steps=100, clock=lambda: now[0])
    for step in range(1, 4):
        now[0] += 10.0
        board.record_step(step, {"sapo/local_reward": 0.5})
    server = StatusServer(node_app(board.snapshot), "127.0.0.1", 0)
    volume = tmp_path / "data"
    volume.mkdir()
    write_status(volume, "training", 3, page=server.url)
    command = [sys.executable, "-m", "sapo.node.cli", *_healthcheck(final_stage)[1:]]  # the console script's module

    def healthcheck() -> tuple[int, str]:
        result = subprocess.run(command, cwd=volume, capture_output=True, text=True, timeout=60)
        return result.returncode, result.stdout

    def healthz() -> int:
        try:
            with urllib.request.urlopen(server.url + "healthz", timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        assert healthz() == 200 and healthcheck() == (0, "ok\n")
        now[0] += STALL_MIN_SECONDS + 1.0  # no step ends: stalled, while the process and its page are up
        assert healthz() == 503
        code, said = healthcheck()
        assert code == 1 and said.startswith("unhealthy\nstalled: no step ended for"), said
        now[0] += 1.0
        board.record_step(4, {"sapo/local_reward": 0.5})  # it steps again
        assert healthz() == 200 and healthcheck()[0] == 0
    finally:
        server.close()
    code, said = healthcheck()  # stopped: nothing answers
    assert code == 1 and "does not answer" in said, said


def test_docker_stop_gives_the_node_time_to_checkpoint(final_stage):
    """`docker stop` sends the image's STOPSIGNAL (SIGTERM: the node checkpoints its last completed step and leaves)
    and kills after its grace: the documented `docker run` lines set one long enough to write that checkpoint."""
    assert _values(final_stage, "STOPSIGNAL") == ["SIGTERM"]
    for path in ("README.md", "docs/docker.md", "docs/node_operations.md"):
        runs = _commands((ROOT / path).read_text(), "docker run")
        assert runs, f"{path} shows no `docker run` line"
        for run in runs:
            grace = _option(run, "--stop-timeout")
            assert grace and int(grace[0]) >= 60, f"{path}: `docker run` without --stop-timeout 60: {' '.join(run)}"


def test_the_documented_docker_run_lines_cap_dockers_log_of_the_node():
    """Docker's default log driver keeps every line of a container's output: a node that runs for months, or a peer
    that makes it log, would fill the host's disk. The documented `docker run` lines cap it."""
    for path in ("README.md", "docs/docker.md", "docs/node_operations.md"):
        for run in _commands((ROOT / path).read_text(), "docker run"):
            caps = dict(value.split("=", 1) for value in _option(run, "--log-opt"))
            assert {"max-size", "max-file"} <= set(caps), f"{path}: `docker run` without --log-opt max-size/max-file"
