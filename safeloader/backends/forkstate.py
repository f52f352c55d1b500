"""The "forkstate" backend: records the parent's threads and pools at each worker fork.

What it records is ``safeloader.forkstate.parent_state()`` in the worker, read by diagnostics.
"""

from __future__ import annotations

from .. import forkstate
from .._context import ForkContext
from ._backend import Backend

NAME = "forkstate"

__all__ = ["BACKEND", "NAME"]


class ForkStateBackend(Backend):
    name = NAME
    description = "records the parent's threads and pools at each fork, for diagnostics"
    plan_per_start = True

    def before(self, ctx: ForkContext) -> forkstate.ForkState:
        return forkstate.record(ctx)


BACKEND = ForkStateBackend()
