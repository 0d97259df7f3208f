"""A node's status file: what the node is doing now, written atomically, read by `local-swarm`'s status line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"


def write_status(output_dir: str | Path, phase: str, step: int, **extra: Any) -> None:
    """Record ``phase`` at ``step`` in ``output_dir``/status.json (a reader never sees half a file), with ``extra``
    fields (the node adds `swarm`: "joined" or "alone", and `page`: its status page's address)."""
    path = Path(output_dir) / STATUS_FILE
    tmp = path.with_name(f".{STATUS_FILE}.tmp")
    tmp.write_text(json.dumps({"phase": phase, "step": step, "time": time.time(), **extra}))
    os.replace(tmp, path)


def read_status(output_dir: str | Path) -> dict[str, Any]:
    """A node's status (`phase`, `step`, `time`, and `swarm`, `page` once known), or {} when it has none yet or it
    cannot be read."""
    try:
        return json.loads((Path(output_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
