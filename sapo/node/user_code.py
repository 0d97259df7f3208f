"""A user's own code named by a node option as `module:name` or `path/to/file.py:name`: the module loader the
source, reward and sampler options share, and the sampler's."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from sapo.node.errors import NodeError


def user_object(spec: str, what: str, prefix: str, form: str) -> tuple[str, str, Any]:
    """``(where, name, object)`` for ``spec`` (`where:name`; ``form`` is how to write it, for the error); the object
    is None when the module has no such name. NodeError, ``what`` first, when the module cannot be loaded."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise NodeError(f"{what}: name {form}")
    return where, name, getattr(user_module(where, what, prefix), name, None)


def user_module(where: str, what: str, prefix: str) -> Any:
    """The module a user names, ``path/to/file.py`` or an importable ``module`` (looked up in the working directory
    too, as `trl grpo` does); NodeError (``what`` first) when it cannot be loaded."""
    import importlib
    import importlib.util
    import os
    import sys

    try:
        if not where.endswith(".py"):
            if os.getcwd() not in sys.path:
                sys.path.append(os.getcwd())  # after the installed packages: a local file never shadows one
            return importlib.import_module(where)
        path = Path(where)
        if not path.is_file():
            raise NodeError(f"{what}: file {path} not found")
        module_spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    except ImportError as e:
        raise NodeError(f"{what}: cannot import {where!r} ({e}); is it on PYTHONPATH?") from None


def user_sampler(spec: str) -> str:
    """Load the sampling strategy `spec` names (`module:Class` or `path/to/file.py:Class`, a
    `sapo.sampling.ExternalSampler` subclass) and register it under its class name, which it returns: the name
    `sampling_strategy` then takes. Raises NodeError saying what is wrong."""
    from sapo.sampling import SAMPLERS, ExternalSampler, register_sampler

    what = f"--sampler {spec!r}"
    where, name, cls = user_object(spec, what, "sapo_user_sampler", "a class as module:Class or path/to/file.py:Class")
    if not (inspect.isclass(cls) and issubclass(cls, ExternalSampler)):
        raise NodeError(f"{what}: {where} has no sapo.sampling.ExternalSampler subclass {name!r}")
    if inspect.isabstract(cls):
        raise NodeError(f"{what}: {name} leaves abstract methods unimplemented: {sorted(cls.__abstractmethods__)}")
    registered = SAMPLERS.get(cls.__name__)
    if registered is not None and (registered.__module__, registered.__qualname__) == (
        cls.__module__,
        cls.__qualname__,
    ):
        SAMPLERS[cls.__name__] = cls  # the same file loaded again (a second parse in one process): its newest class
        return cls.__name__
    try:
        register_sampler(cls.__name__, cls)
    except ValueError as e:
        raise NodeError(f"{what}: {e}; rename the class") from None
    return cls.__name__
