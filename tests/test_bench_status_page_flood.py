"""benchmarks.status_page_flood, briefly: each code's page is served from a process of that code's tree and flooded
on every route, and the report lists both codes' figures."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

from benchmarks import status_page_flood
from benchmarks.harness import ROOT


def worktrees() -> list[str]:
    """The repository's worktrees, one line each."""
    return subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout.splitlines()


def test_both_codes_pages_are_flooded_on_every_route_and_reported(tmp_path, monkeypatch):
    made: list[Path] = []  # the base's worktree, as the benchmark made it (other tests' may come and go meanwhile)
    real = status_page_flood.base_worktree

    @contextlib.contextmanager
    def recorded(base: str):
        with real(base) as tree:
            made.append(tree)
            yield tree

    monkeypatch.setattr(status_page_flood, "base_worktree", recorded)
    argv = ["--base", "HEAD", "--rounds", "1", "--clients", "2", "--seconds", "0.5", "--output-dir", str(tmp_path)]
    data = status_page_flood.main(argv)
    results = data["results"]
    assert set(results) == {"base HEAD", "this tree"}
    for code in results.values():
        assert set(code) == set(status_page_flood.ROUTES)
        assert all(route["answered_per_s"] > 0 and route["server_cores"] >= 0 for route in code.values())
    page = (tmp_path / "status_page_flood.md").read_text()
    assert "| base HEAD | `/` |" in page and "| this tree | `/metrics` |" in page
    assert json.loads((tmp_path / "status_page_flood.json").read_text())["clients"] == 2
    (tree,) = made
    assert str(tree) not in {line.split()[0] for line in worktrees()} and not tree.exists()  # removed
