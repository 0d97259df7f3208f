"""JSON-lines files a node appends to, rotated by size, and read back oldest first (its rotated files included)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


class RotatingJsonl:
    """Appends lines to a file, rotated when the next line would take it past ``max_bytes``.

    Rotation keeps ``backups`` older files (``NAME.1`` the newest of them, ``NAME.2`` the one before); what is older
    is deleted. A line is written whole or not at all: the file is opened in append mode and each line is one write.

    Args:
        path: the file.
        max_bytes: size past which the file is rotated before the next line.
        backups: rotated files kept (0: the file is emptied instead).
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int, backups: int):
        if max_bytes <= 0 or backups < 0:
            raise ValueError(f"max_bytes must be positive and backups at least 0, got {max_bytes} and {backups}")
        self.path = Path(path)
        self.max_bytes, self.backups = max_bytes, backups
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, lines: Sequence[str]) -> None:
        """Append each of ``lines`` (without its newline) as one line."""
        for line in lines:
            self._rotate_if_full(len(line.encode()) + 1)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")

    def _rotate_if_full(self, incoming: int) -> None:
        size = self.path.stat().st_size if self.path.exists() else 0
        if size == 0 or size + incoming <= self.max_bytes:
            return
        if self.backups == 0:
            self.path.unlink()
            return
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))


def jsonl_files(path: str | os.PathLike[str]) -> list[Path]:
    """``path``'s rotated files (``NAME.N``), oldest first, then ``path`` itself: those that exist."""
    path = Path(path)
    rotated = [p for p in path.parent.glob(f"{path.name}.*") if p.suffix[1:].isdigit()]
    return [p for p in [*sorted(rotated, key=lambda p: -int(p.suffix[1:])), path] if p.exists()]


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every record of ``path`` and its rotated files, oldest first, one line at a time (a torn line, from a kill
    mid-write, is skipped)."""
    for file in jsonl_files(path):
        with file.open(encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict):
                    yield record
