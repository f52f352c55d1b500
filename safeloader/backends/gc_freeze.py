"""The "gc" backend: each worker freezes the objects it inherits (option ``freeze_gc``).

How it works and why: docs/internals.md, ``safeloader.backends.gc_freeze``.
"""

from __future__ import annotations

import gc

from .. import _registry, hook_names
from .._registry import fork_context
from ._backend import Backend

NAME = hook_names.GC

__all__ = ["BACKEND", "NAME"]


class GcBackend(Backend):
    name = hook_names.GC
    description = "each worker freezes the objects it inherits (no copy-on-write by its garbage collections)"

    def __init__(self) -> None:
        # On the instance, not in a plan: an interrupt (Ctrl-C) can cut `before` short after the
        # mark, and after_in_parent must still turn collection back on (a plan would be lost with
        # `before`). The worker inherits the mark: collection was paused for it.
        self.paused_here = False

    def before(self) -> None:
        context = fork_context()
        if context is None or not context.options.freeze_gc or not gc.isenabled():
            return  # also at a start's later forks: paused since its first
        # Paused, not frozen: no collection runs in the worker before it freezes what it inherited,
        # and the parent's generations stay as they were (unfreezing here would move every young
        # object, the starting iterator too, into the oldest generation: cyclic garbage would
        # then wait for a full collection). Marked first: unpausing what is not paused is harmless.
        # At a start safeloader armed, paused until its last fork (a collection between two forks
        # would write pages the workers forked so far share), and nothing to do at its other forks.
        _registry.hold_for_start(NAME, self._resume)
        self.paused_here = True
        gc.disable()

    def _resume(self) -> None:
        if self.paused_here:
            gc.enable()  # then unmarked: interrupted between the two, it runs again (harmlessly)
            self.paused_here = False

    def after_in_parent(self, plan: None) -> None:
        if self.paused_here and not _registry.held_for_start(NAME):
            gc.enable()  # then unmarked: interrupted between the two, it runs again (harmlessly)
            self.paused_here = False

    def after_in_child(self, plan: None) -> None:
        context = fork_context()
        # Objects the program froze itself are left to it (gc.get_freeze_count() > 0), as in the parent.
        if context is not None and context.options.freeze_gc and gc.get_freeze_count() == 0:
            gc.freeze()
        if self.paused_here:
            self.paused_here = False
            gc.enable()


BACKEND = GcBackend()
