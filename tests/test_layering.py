"""The arrows of README.md's Layout: sapo uses swarm and rewards; swarm and rewards use neither sapo, nor each
other, nor trl or transformers; and the modules of sapo import each other without a circle."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sapo."):
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module == "sapo":
            found.update(f"sapo.{alias.name}" for alias in node.names if (ROOT / "sapo" / f"{alias.name}.py").exists())
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("sapo."))
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as a path, or None."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target] if target in path else [module, target]
            if target not in state and (found := visit(target, [*path, target])):
                return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def test_sapo_modules_import_each_other_without_a_circle():
    graph = {f"sapo.{p.stem}": _sapo_imports(p) - {f"sapo.{p.stem}"} for p in (ROOT / "sapo").glob("*.py")}
    graph.pop("sapo.__init__", None)  # the package's lazy re-exports point down at everything
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph))}"
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check itself finds one
