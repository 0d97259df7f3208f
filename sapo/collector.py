"""The garbage collector while a trainer trains: what is alive when training starts is left out of its scans."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def long_lived_frozen(collect_first: bool = False) -> Iterator[None]:
    """Leave every object alive on entry (the libraries, the model, the trainer, the swarm transport) out of the
    garbage collector's scans until exit.

    With a model and its libraries loaded a process holds about half a million objects, and a full collection walks
    them all while it holds the interpreter's lock: a pause of 0.1 s to over a second, during which the swarm
    transport's event loop in the same process answers nobody. Frozen, a full collection walks only what training
    made since. Objects already garbage on entry are collected on exit. A caller that froze objects itself (the node
    does, before it joins the swarm) keeps them frozen after exit. ``collect_first`` (default False) collects what is
    garbage already before freezing (a full collection: seconds with a model loaded), so that none of it is kept.
    """
    caller_froze = gc.get_freeze_count() > 0
    if collect_first:
        gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not caller_froze:
            gc.unfreeze()
