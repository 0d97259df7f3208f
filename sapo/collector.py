"""The garbage collector while a trainer trains: what is alive when training starts is left out of its scans."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_owner_froze = False
"""Whether :func:`freeze_long_lived` froze this process's objects and no :func:`thaw` has undone it since."""

_frozen_on_top = 0
"""How many times :func:`long_lived_frozen` froze what was made since an owner's freeze (see :func:`frozen_on_top`)."""


def freeze_long_lived() -> None:
    """Leave the objects alive now (the libraries and a loaded model: they live as long as the process) out of the
    garbage collector's scans until :func:`thaw`, after one collection of what is garbage already.

    A full collection then takes milliseconds instead of the seconds a loaded model and its libraries cost (over
    2 s on a busy machine): a node's swarm transport runs one in its teardown, and a stop must fit in `docker stop`'s
    grace.
    """
    global _owner_froze
    gc.collect()
    gc.freeze()
    _owner_froze = True


def thaw() -> None:
    """Undo :func:`freeze_long_lived` (for a caller that goes on in the same process); nothing when nothing is
    frozen."""
    global _owner_froze
    gc.unfreeze()
    _owner_froze = False


def owner_froze() -> bool:
    """Whether :func:`freeze_long_lived` froze this process's objects and no :func:`thaw` has undone it since."""
    return _owner_froze


def frozen_on_top() -> int:
    """How many times training under a caller's freeze froze what was made since (:func:`long_lived_frozen`): those
    objects stay frozen, garbage or not, until a :func:`thaw`. A process that trains again and again (a test worker)
    thaws and freezes anew when the frozen objects have grown."""
    return _frozen_on_top


@contextlib.contextmanager
def long_lived_frozen(collect_first: bool = False) -> Iterator[None]:
    """Leave every object alive on entry (the libraries, the model, the trainer, the swarm transport) out of the
    garbage collector's scans until exit.

    With a model and its libraries loaded a process holds about half a million objects, and a full collection walks
    them all while it holds the interpreter's lock: a pause of 0.1 s to over a second, during which the swarm
    transport's event loop in the same process answers nobody. Frozen, a full collection walks only what training
    made since. Objects already garbage on entry are collected on exit. A caller that froze objects itself (the node
    does, before it joins the swarm, with :func:`freeze_long_lived`; or with ``gc.freeze()``) keeps them frozen after
    exit. ``collect_first`` (default False) collects what is garbage already before freezing (a full collection:
    seconds with a model loaded), so that none of it is kept.
    """
    global _frozen_on_top
    # The owner's mark first: counting the frozen objects walks every one (about 50 ms for half a million).
    caller_froze = _owner_froze or gc.get_freeze_count() > 0
    if collect_first:
        gc.collect()
    gc.freeze()
    if caller_froze:
        _frozen_on_top += 1
    try:
        yield
    finally:
        if not caller_froze:
            gc.unfreeze()
