"""CI runs the README's test command, the dev extra installs what that command needs, and no tracked file names a
package registry's host (the index is pip's own configuration, the user's or the image builder's)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_test_command() -> str:
    """The one command in the README's "Tests" section's bash block."""
    section = ROOT.joinpath("README.md").read_text().split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S)
    assert block, "README's Tests section has no bash block"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_ci_runs_exactly_the_readmes_test_command():
    command = _readme_test_command()
    script = ROOT.joinpath(".ci", "run").read_text().splitlines()
    assert "set -euo pipefail" in script  # a failing test fails CI
    assert "bash setup.sh" in script  # installed from scratch as the README says
    pytest_lines = [line for line in script if "-m pytest" in line]
    assert pytest_lines == [command], (pytest_lines, command)
    assert "--durations=20" in command  # the slowest tests are printed, so regressions show


def test_the_dev_extra_installs_the_plugins_the_command_uses():
    command = _readme_test_command()
    dev = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    names = {re.split(r"[<>=!~ \[]", requirement, maxsplit=1)[0] for requirement in dev}
    if re.search(r"(^| )-n ", command):
        assert "pytest-xdist" in names
    assert "pytest-timeout" in names


# Package registries' hosts, as patterns whose own text does not contain them.
REGISTRY_HOST = re.compile(
    r"\b(pypi\.org|pypi\.python\.org|files\.pythonhosted\.org|download\.pytorch\.org|registry\.npmjs\.org"
    r"|deb\.debian\.org|security\.debian\.org|archive\.ubuntu\.com|(conda|repo)\.anaconda\.(org|com))\b",
    re.IGNORECASE,
)


def test_no_tracked_file_names_a_package_registry_host():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    found = []
    for name in filter(None, listed.stdout.decode().split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary (archives, images)
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if REGISTRY_HOST.search(line):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    assert not found, "package registry hosts written in tracked files (leave the index to pip):\n" + "\n".join(found)


def test_the_registry_host_check_finds_a_host():
    assert REGISTRY_HOST.search("pip install --index-url https://" + "pypi" + ".org/simple x")
    assert REGISTRY_HOST.search("--extra-index-url https://download" + ".pytorch.org/whl/cpu")
    assert not REGISTRY_HOST.search("set TORCH_INDEX_URL to PyTorch's CPU wheel index; PyPI's torch is the CUDA build")


def test_the_long_files_scheduled_first_exist_and_the_command_keeps_their_order():
    from tests.conftest import LONG_FILES

    missing = [name for name in LONG_FILES if not ROOT.joinpath(name).is_file()]
    assert not missing, f"tests/conftest.py LONG_FILES names files that do not exist: {missing}"
    assert len(set(LONG_FILES)) == len(LONG_FILES)
    assert "--no-loadscope-reorder" in _readme_test_command()  # else xdist puts these few-test files last
