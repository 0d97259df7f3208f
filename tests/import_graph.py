"""One import circle of a module graph, found for both layering checks (the project's and the benchmarks')."""

from __future__ import annotations


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
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
