"""The "gc" backend: freeze the parent's objects around each worker fork (option ``freeze_gc``).

How it works and why: docs/internals.md, ``safeloader.backends.gc_freeze``.
"""

from __future__ import annotations

import gc

from .. import hook_names
from .._registry import fork_context
from ._backend import Backend

NAME = hook_names.GC

__all__ = ["BACKEND", "NAME"]

_frozen_here = False


def _before() -> None:
    global _frozen_here
    context = fork_context()
    if context is None or not context.options.freeze_gc or gc.get_freeze_count() > 0:
        return
    # Marked before freezing: an interrupt (Ctrl-C) landing between the two must not leave the
    # heap frozen with no mark (after_in_parent then unfreezes; unfreezing nothing is harmless).
    _frozen_here = True
    gc.freeze()


def _after_in_parent() -> None:
    global _frozen_here
    if _frozen_here:
        gc.unfreeze()  # then unmarked: interrupted between the two, it runs again (harmlessly)
        _frozen_here = False


def _after_in_child() -> None:
    global _frozen_here
    _frozen_here = False  # the worker keeps them frozen; a fork from it must not unfreeze


class GcBackend(Backend):
    name = hook_names.GC
    description = "the parent's objects are frozen around forks (no copy-on-write by worker GCs)"
    before = _before
    after_in_parent = _after_in_parent
    after_in_child = _after_in_child

BACKEND = GcBackend
