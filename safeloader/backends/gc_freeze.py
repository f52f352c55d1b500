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

class GcBackend(Backend):
    name = hook_names.GC
    description = "the parent's objects are frozen around forks (no copy-on-write by worker GCs)"

    def __init__(self) -> None:
        # On the instance, not in a plan: an interrupt (Ctrl-C) can cut `before` short after the
        # mark, and after_in_parent must still unfreeze (a plan would be lost with `before`).
        self.frozen_here = False

    def before(self) -> None:
        context = fork_context()
        if context is None or not context.options.freeze_gc or gc.get_freeze_count() > 0:
            return
        # Marked before freezing: an interrupt landing between the two must not leave the heap
        # frozen with no mark (after_in_parent then unfreezes; unfreezing nothing is harmless).
        self.frozen_here = True
        gc.freeze()

    def after_in_parent(self, plan: None) -> None:
        if self.frozen_here:
            gc.unfreeze()  # then unmarked: interrupted between the two, it runs again (harmlessly)
            self.frozen_here = False

    def after_in_child(self, plan: None) -> None:
        self.frozen_here = False  # the worker keeps them frozen; a fork from it must not unfreeze


BACKEND = GcBackend()
