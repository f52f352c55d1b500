"""The "gc" backend: each worker freezes the objects it inherits (option ``freeze_gc``)
(why: docs/internals.md)."""

from __future__ import annotations

import gc

from .._context import ForkContext
from .._hooks import FastFork
from ._backend import Backend

NAME = "gc"
PAUSED = True
"""The plan of a fork around which ``before`` paused collection (the C path's later forks too)."""

__all__ = ["BACKEND", "NAME"]


class GcBackend(Backend):
    name = NAME
    description = "each worker freezes the objects it inherits (no copy-on-write by its garbage collections)"

    def before(self, ctx: ForkContext) -> bool | None:
        if ctx is None or not ctx.options.freeze_gc or not gc.isenabled():
            return None  # the program paused collection itself: left as it is, here and in the worker
        # Paused, not frozen: no collection runs in the worker before it freezes what it inherited,
        # and the parent's generations stay as they were (unfreezing here would move every young
        # object, the starting iterator too, into the oldest generation: cyclic garbage would
        # then wait for a full collection). Paused around this fork only, as torch leaves gc between
        # forks and while it runs the sampler's __iter__: a start's garbage (a sampler's cycles) is
        # collected as under torch. The plan first: cut short after it, after_in_parent still
        # resumes collection (resuming what is not paused is harmless).
        self.set_plan(PAUSED)
        gc.disable()
        return PAUSED

    def after_in_parent(self, ctx: ForkContext, plan: bool | None) -> None:
        if plan is PAUSED:
            gc.enable()

    def after_in_child(self, ctx: ForkContext, plan: bool | None) -> None:
        # Objects the program froze itself are left to it (gc.get_freeze_count() > 0), as in the parent.
        if ctx is not None and ctx.options.freeze_gc and gc.get_freeze_count() == 0:
            gc.freeze()
        if plan is PAUSED:
            gc.enable()

    def fast_fork(self, ctx: ForkContext, plan: bool | None) -> FastFork:
        # Paused around each later fork too where it was paused around this one (the worker resumes it).
        return FastFork(worker_plan=PAUSED, pause_gc=True) if plan is PAUSED else FastFork()


BACKEND = GcBackend()
