"""Reading a GGUF file through transformers with each costly part done once: the file's fields, its metadata parsed
into Python values, and gguf's tensor-name map."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["gguf_read_once"]


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """Within the block, transformers' GGUF loading reads each file once. Left alone it reads a file's metadata (its
    whole vocabulary, field by field) anew for the config, the tokenizer and the weights, parses it into Python values
    for each of them, and builds gguf's tensor-name map anew for every module of the model (397 times for SmolLM2).
    Here the reader of a file is made once and slices a plain array view of the file's memory map (a memmap's own
    slices cost several times more, and Gemma 3's 262,144 words take 786,000 of them); the metadata-only parse
    (``return_tensors=False``) is made once per file and handed out as copies; the name map is made once per
    architecture. All of these are only read, so sharing them changes nothing read."""
    import gguf
    import numpy as np
    from transformers import modeling_gguf_pytorch_utils

    class PlainArrayReader(gguf.gguf_reader.GGUFReader):
        """gguf's reader over a plain array view of the file's memory map (same bytes, no copy)."""

        @property
        def data(self) -> Any:
            return self._plain_data

        @data.setter
        def data(self, value: Any) -> None:
            self._plain_data = value.view(np.ndarray)

    name_map, load_checkpoint = gguf.get_tensor_name_map, modeling_gguf_pytorch_utils.load_gguf_checkpoint
    reader, readers, maps, metadata = gguf.GGUFReader, {}, {}, {}

    def shared_reader(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = PlainArrayReader(path, mode)
        return readers[key]

    def shared_name_map(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = name_map(arch, n_blocks)
        return maps[arch, n_blocks]

    def metadata_once(path: Any, return_tensors: bool = False, **kwargs: Any) -> Any:
        if return_tensors or kwargs:
            return load_checkpoint(path, return_tensors=return_tensors, **kwargs)
        key = os.fspath(path)
        if key not in metadata:
            metadata[key] = load_checkpoint(path, return_tensors=False)
        return copy.deepcopy(metadata[key])  # its callers may change the dictionaries they get

    gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, shared_name_map
    modeling_gguf_pytorch_utils.load_gguf_checkpoint = metadata_once
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
        modeling_gguf_pytorch_utils.load_gguf_checkpoint = load_checkpoint
