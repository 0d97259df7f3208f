"""The package arrows of DESIGN.md: sapo uses swarm and rewards; swarm and rewards use neither sapo, nor
each other, nor trl or transformers."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "modules, forbidden",
    [
        (["swarm", "swarm.records", "swarm.validation", "swarm.daemon", "swarm.dht", "swarm.memory"],
         ["sapo", "rewards", "trl", "transformers"]),
        (["rewards", "rewards.functions", "rewards.extract", "rewards.combine"],
         ["sapo", "swarm", "trl", "transformers"]),
    ],
)  # fmt: skip
def test_lower_packages_do_not_import_upper_ones(modules, forbidden):
    code = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in {forbidden!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", f"{modules[0]} pulls in {result.stdout.strip()}"
