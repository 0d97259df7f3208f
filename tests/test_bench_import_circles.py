"""No import circle anywhere in the repository's own modules (sapo, swarm, rewards, testbed, benchmarks):
every import counts, at a module's top or inside a function, as tests/test_layering.py counts them for sapo."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.import_graph import cycle

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sapo", "swarm", "rewards", "testbed", "benchmarks")


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Each first-party module and the first-party modules it imports (``from a import b``: ``a.b`` where that is a
    module, else ``a``); a package's own ``__init__`` re-exports left out, as they point down."""
    modules = {_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph = {}
    for module, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                targets.update(subs or ({node.module} & modules.keys()))
        graph[module] = targets - {module}
    for package in [m for m, p in modules.items() if p.name == "__init__.py"]:
        graph.pop(package)
    return graph


def test_no_module_of_the_repository_imports_itself_through_others():
    graph = _graph()
    assert "benchmarks.campaign_report" in graph and "swarm.dht" in graph
    assert cycle(graph) is None, f"import circle: {' -> '.join(cycle(graph))}"
    assert cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the check finds one
