"""Python's cyclic garbage collector paused while a model loads.

A load creates about 400,000 long-lived objects (transformers' modules, the
tokenizer's tables, the model), and collecting while they pile up scans
them again and again: a process's first SmolLM2 load takes 0.8–1.0 s with
the collector on and 0.5–0.7 s paused (imports done before); 0.7 s of a
6.4 s `specdec generate`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextlib.contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """The collector off inside, back as it was after (a nested pause, or a
    caller's own `gc.disable()`, is left alone). With `freeze` (a command's
    own process) what was loaded is then moved out of every later
    collection's way (`gc.freeze`; `gc.unfreeze` at exit, so the final
    collection still runs); else the collector only resumes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if freeze:
                gc.freeze()
                atexit.register(gc.unfreeze)
            gc.enable()


def paused_while_loading(load: Callable[P, R]) -> Callable[P, R]:
    """`load` run inside `collector_paused()` (a loader's decorator)."""

    @functools.wraps(load)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        with collector_paused():
            return load(*args, **kwargs)

    return paused
