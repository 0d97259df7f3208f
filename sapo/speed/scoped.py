"""Replacements that last one context: an attribute, a registry entry or a module's forward, put back on exit.

Every speed-up of `sapo.speed` that changes code of another library (torch, TRL, transformers, PEFT, a model
instance) does it through these, so nothing stays installed after the call that needed it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any

__all__ = ["attribute_replaced", "entry_added", "forwards_replaced"]


@contextlib.contextmanager
def attribute_replaced(owner: Any, name: str, value: Any) -> Iterator[Any]:
    """Within the context, ``owner.name`` is ``value``; the original is yielded and put back on exit (an attribute
    the owner only inherited, e.g. a method of an instance's class, is deleted again instead; a property is set
    back through its setter)."""
    own = name in vars(owner) or hasattr(getattr(type(owner), name, None), "__set__")
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield original
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def entry_added(mapping: MutableMapping[str, Any], key: str, value: Any) -> Iterator[None]:
    """Within the context, ``mapping[key]`` is ``value`` and is removed on exit; a key already present (an enclosing
    context, or someone else's registration) is left as it is."""
    if key in mapping:
        yield
        return
    mapping[key] = value
    try:
        yield
    finally:
        mapping.pop(key, None)


@contextlib.contextmanager
def forwards_replaced(replacements: Iterable[tuple[Any, Callable[[], Any]]]) -> Iterator[None]:
    """Within the context, each module of ``replacements`` computes with the forward its factory makes (set as the
    instance's ``forward``); on exit the class's forward is back. A module whose forward is already replaced on the
    instance (an accelerate hook) is left as it is, and its factory is not called."""
    swapped = []
    try:
        for module, make_forward in replacements:
            if "forward" not in vars(module):
                module.forward = make_forward()
                swapped.append(module)
        yield
    finally:
        for module in swapped:
            del module.forward  # the instance attribute: the class's forward again
