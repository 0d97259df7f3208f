"""CI runs the README's test command, and the dev extra installs what that command needs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    command = _readme_test_command()
    dev = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    names = {re.split(r"[<>=!~ \[]", requirement, maxsplit=1)[0] for requirement in dev}
    if re.search(r"(^| )-n ", command):
        assert "pytest-xdist" in names
    assert "pytest-timeout" in names
