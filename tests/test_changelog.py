"""CHANGELOG.md keeps the order it states: within each version, the library's entries first, then the benchmarks'
under `### Benchmarks`."""

from __future__ import annotations

import re
from pathlib import Path

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"
BENCHMARK_ENTRY = re.compile(r"- (`(python -m )?benchmarks[./]|Experiment \d)")


def test_each_version_lists_the_library_first_and_the_benchmarks_under_their_heading():
    versions = re.split(r"^## ", CHANGELOG.read_text(), flags=re.MULTILINE)[1:]
    assert versions and versions[0].startswith("Unreleased")
    for version in versions:
        library, _, benchmarks = version.partition("\n### Benchmarks\n")
        misplaced = [line[:80] for line in library.splitlines() if BENCHMARK_ENTRY.match(line)]
        assert not misplaced, f"benchmark entries above `### Benchmarks` in {version.splitlines()[0]}: {misplaced}"
        assert "\n### " not in benchmarks, "the benchmarks close each version"
