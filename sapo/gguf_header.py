"""A GGUF file's header read without transformers (milliseconds, where transformers parses the whole vocabulary):
its key-value fields, and one string field by key."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
"""The bytes a GGUF file starts with."""

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
"""The struct format of each scalar value type of GGUF's key-value fields."""

STRING, ARRAY = 8, 9
"""GGUF's value types for a string and an array."""


class NotGGUF(ValueError):
    """A file that does not start with :data:`MAGIC`."""


def read_string(f: BinaryIO | Any) -> str:
    """One GGUF string (a 64-bit length, then UTF-8) at ``f``'s position; raises ``ValueError`` for one over 64 KiB
    (keys and names are short: more means a damaged or foreign file) or cut short."""
    (length,) = struct.unpack("<Q", f.read(8))
    if length > 1 << 16:
        raise ValueError(f"a {length}-byte name in the header")
    data = f.read(length)
    if len(data) < length:
        raise ValueError("the file ends inside its header")
    return data.decode("utf-8")


def skip_value(f: BinaryIO | Any, kind: int) -> None:
    """Move ``f`` past one value of type ``kind`` (arrays of scalars in one seek); raises ``ValueError`` for a type
    GGUF does not define."""
    if kind in SCALARS:
        f.seek(struct.calcsize(SCALARS[kind]), os.SEEK_CUR)
    elif kind == STRING:
        f.seek(struct.unpack("<Q", f.read(8))[0], os.SEEK_CUR)
    elif kind == ARRAY:
        item_kind, count = struct.unpack("<IQ", f.read(12))
        if item_kind in SCALARS:
            f.seek(count * struct.calcsize(SCALARS[item_kind]), os.SEEK_CUR)
        else:
            for _ in range(count):
                skip_value(f, item_kind)
    else:
        raise ValueError(f"unknown value type {kind} in the header")


def string_field(path: str | Path, key: str) -> str | None:
    """The string field ``key`` of the GGUF file at ``path`` (e.g. ``general.architecture``), None if it has none.
    Raises :class:`NotGGUF`, or ``ValueError``/``struct.error``/``UnicodeDecodeError`` for a damaged header."""
    with Path(path).open("rb") as f:
        if f.read(4) != MAGIC:
            raise NotGGUF(f"{path} does not start with the bytes 'GGUF'")
        _version, _tensors, entries = struct.unpack("<IQQ", f.read(20))
        for _ in range(entries):
            name = read_string(f)
            (kind,) = struct.unpack("<I", f.read(4))
            if name == key and kind == STRING:
                return read_string(f)
            skip_value(f, kind)
    return None
