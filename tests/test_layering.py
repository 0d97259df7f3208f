"""The arrows of README.md's Layout: sapo uses swarm and rewards; swarm and rewards use neither sapo, nor each
other, nor trl or transformers; the node application (sapo.node) builds on the algorithm modules of sapo, which never
import it; nothing installed imports the attack tooling; and the modules of sapo import each other without a circle."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.import_graph import cycle

ROOT = Path(__file__).resolve().parent.parent


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


def _sapo_imports(path: Path) -> set[str]:
    """The sapo modules a file imports, at its top or inside a function (a lazy import is an arrow too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(("sapo.", "testbed")):
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module == "sapo":
            found.update(f"sapo.{alias.name}" for alias in node.names if (ROOT / "sapo" / f"{alias.name}.py").exists())
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(("sapo.", "testbed")))
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sapo_graph() -> dict[str, set[str]]:
    """Each sapo module and the sapo modules it imports; the packages' lazy re-exports left out (they point down)."""
    graph = {_module_name(p): _sapo_imports(p) for p in (ROOT / "sapo").rglob("*.py")}
    for package in ("sapo", "sapo.node"):
        graph.pop(package, None)
    return {module: targets - {module} for module, targets in graph.items()}


def test_algorithm_modules_never_import_the_node_application_or_the_attacks():
    graph = _sapo_graph()
    algorithm = [m for m in graph if not m.startswith("sapo.node.") and m != "sapo.cli"]
    assert "sapo.trainer" in algorithm and "sapo.node.runner" in graph
    for module in algorithm:
        upward = sorted(t for t in graph[module] if t.startswith(("sapo.node", "testbed")))
        assert not upward, f"{module} (the algorithm layer) imports {upward}"
    node = [m for m in graph if m.startswith("sapo.node.")]
    for module in node:
        attacks = sorted(t for t in graph[module] if t.startswith("testbed"))
        assert not attacks, f"{module} (installed) imports the attack tooling {attacks}"


def test_sapo_modules_import_each_other_without_a_circle():
    graph = _sapo_graph()
    assert cycle(graph) is None, f"import circle: {' -> '.join(cycle(graph))}"
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check itself finds one
