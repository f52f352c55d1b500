"""blosc2: C-Blosc2's thread pools, started in the parent, do not hang forked workers
(why: docs/internals.md)."""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from .. import _hooks
from .._context import ForkContext
from .._options import Options
from ..errors import Blosc2PoolError
from ._backend import Backend
from ._object_graph import find_instances

NAME = "blosc2"

__all__ = ["BACKEND", "NAME", "Blosc2PoolError", "resets_pools_in_child"]

_EXTENSION = "blosc2_ext"
"""C-Blosc2's threads wait in this extension module (the C library is linked into it)."""
_EXIT_WAIT = 0.05
"""Seconds a joined thread may still be listed by the kernel before it counts as alive."""
RESETS_ITS_POOLS = (3, 6)
"""C-Blosc2 from this release on (python-blosc2 4.15) starts its shared pools afresh in a forked
child by itself (pthread_atfork handlers of its own; checked: 3.6.1 does, 3.3.5 hangs the worker):
torch's own loader works there, and its pools cached in the parent are no hazard.
tests/test_blosc2.py runs torch's loader to check this claim on whichever C-Blosc2 is installed."""


def resets_pools_in_child() -> bool:
    """Whether the loaded C-Blosc2 is one that starts its pools afresh in a forked child."""
    import blosc2

    try:
        version = tuple(int(part) for part in str(blosc2.VERSION_STRING).split(".")[:2])
    except (AttributeError, ValueError):
        return False
    return version >= RESETS_ITS_POOLS


@dataclass
class _Plan:
    """One fork's: what the parent lowered before it, and what the worker sets from it."""

    global_threads: int
    """The parent's global context's threads (``blosc2.set_nthreads``), lowered to 1."""
    default_threads: int
    """``blosc2.nthreads``: new arrays' and ``compress``/``decompress``'s threads."""
    budget: int
    """The worker's thread budget."""
    lowered: list[tuple[Any, int, int]] = field(default_factory=list)
    """(SChunk, its cparams' threads, its dparams' threads), lowered to 1 thread."""


def _unique(schunks: Any) -> list[Any]:
    return list({id(schunk): schunk for schunk in schunks}.values())


def _lower(schunks: list[Any], plan: _Plan) -> None:
    """Set each SChunk that uses threads to 1 thread (noted in ``plan``); its contexts detach from their pools."""
    import blosc2

    done = {id(entry[0]) for entry in plan.lowered}
    for schunk in schunks:
        if id(schunk) in done:
            continue
        cthreads, dthreads = schunk.cparams.nthreads, schunk.dparams.nthreads
        if cthreads <= 1 and dthreads <= 1:
            continue
        plan.lowered.append((schunk, cthreads, dthreads))
        if cthreads > 1:
            schunk.cparams = dataclasses.replace(schunk.cparams, nthreads=1)
        if dthreads > 1:
            schunk.dparams = blosc2.DParams(nthreads=1)


def _set_threads(schunk: Any, cthreads: int, dthreads: int) -> None:
    import blosc2

    if schunk.cparams.nthreads != cthreads:
        schunk.cparams = dataclasses.replace(schunk.cparams, nthreads=cthreads)
    if schunk.dparams.nthreads != dthreads:
        schunk.dparams = blosc2.DParams(nthreads=dthreads)


def _pool_threads() -> int:
    """How many of this process's threads wait in C-Blosc2 (a joined thread can stay listed for
    a moment after its join: looked at again for up to ``_EXIT_WAIT`` seconds)."""
    from .. import native
    from ..diagnostics import thread_owners

    deadline = time.monotonic() + _EXIT_WAIT
    while True:
        owners = thread_owners.owners(native.thread_census().foreign).values()
        count = sum(1 for path in owners if path and os.path.basename(path).startswith(_EXTENSION))
        if not count or time.monotonic() >= deadline:
            return count
        time.sleep(0.002)


def _all_schunks(schunk_type: type) -> list[Any]:
    """Every SChunk of the process, by type (never ``isinstance``: a proxy's ``__class__`` runs code),
    frozen objects included (unfrozen for the scan)."""
    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()
    try:
        objects = gc.get_objects()
    finally:
        if frozen:
            gc.freeze()
    hits: dict[type, bool] = {}
    found = []
    for obj in objects:
        cls = type(obj)
        hit = hits.get(cls)
        if hit is None:
            hit = hits[cls] = issubclass(cls, schunk_type)
        if hit:
            found.append(obj)
    return found


class Blosc2Backend(Backend):
    name = NAME
    description = "blosc2's thread pools are stopped around each fork; each worker starts its own, within the budget"
    requires = ("blosc2",)
    libraries = ("blosc2",)  # the blosc2 package's C-Blosc2 (blosc2_ext), not another's libblosc2
    # Outermost: its `before` stops blosc2's threads before any other hook looks at the parent's threads
    # (forkstate's record, which threadpools, polars and zarrs plan from and the worker reads as its
    # parent's state: those threads are gone at the fork); its `after_in_parent` restarts them last.
    last = True

    def __init__(self) -> None:
        # loader -> the SChunks to lower before each of its worker forks (the Dataset's, at its
        # start; all the process's once one was needed).
        self._schunks: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        if "blosc2" not in sys.modules or loader is None:
            return
        if start_method != "fork" or not _hooks.hook_runs(NAME, options):
            self._schunks.pop(loader, None)
            return
        from blosc2 import blosc2_ext

        found = find_instances(getattr(loader, "dataset", None), blosc2_ext.SChunk)
        self._schunks[loader] = _unique(schunk for _holder, _key, schunk in found)

    def before(self, ctx: ForkContext) -> _Plan | None:
        if ctx is None:
            return None
        import blosc2
        from blosc2 import blosc2_ext

        budget = ctx.options.threads_per_worker(ctx.num_workers)
        # The plan is this fork's before anything is lowered: after_in_parent restores what was,
        # whatever stops `before` (an error, an interrupt).
        plan = _Plan(1, int(blosc2.nthreads), budget)
        self.set_plan(plan)
        plan.global_threads = int(blosc2_ext.set_nthreads(1))
        loader = ctx.loader
        known = self._schunks.get(loader, []) if loader is not None else []
        _lower(known, plan)
        # A C-Blosc2 that resets its pools in the child keeps 3.x's shared pools cached in the parent
        # whatever its contexts use: nothing to wait for, and nothing to refuse.
        if resets_pools_in_child() or not _pool_threads():
            return plan
        everything = _all_schunks(blosc2_ext.SChunk)  # an array held outside the Dataset keeps a pool
        _lower(everything, plan)
        if loader is not None:
            try:
                self._schunks[loader] = everything  # this start's later forks lower them all at once
            except TypeError:  # a loader that cannot be weakly referenced
                pass
        left = _pool_threads()
        if left:
            raise Blosc2PoolError(
                f"safeloader: blosc2 still runs {left} thread(s) after every blosc2 context it can reach was set "
                "to 1 thread, so a forked DataLoader worker using blosc2 would wait forever: a context held by "
                "other native code keeps a C-Blosc2 pool, or another thread is compressing or decompressing right "
                "now. Use blosc2 with 1 thread in the parent (blosc2.set_nthreads(1), nthreads=1 in "
                "cparams/dparams), open the arrays in the workers, or pass on_unsafe_fork='forkserver' with "
                "disable_hooks=('blosc2',)"
            )
        return plan

    def after_in_parent(self, ctx: ForkContext, plan: _Plan | None) -> None:
        if plan is None:
            return
        from blosc2 import blosc2_ext

        # Idempotent: run again if an interrupt cut it short.
        for schunk, cthreads, dthreads in plan.lowered:
            _set_threads(schunk, cthreads, dthreads)
        blosc2_ext.set_nthreads(plan.global_threads)

    def after_in_child(self, ctx: ForkContext, plan: _Plan | None) -> None:
        if plan is None:
            return
        import blosc2
        from blosc2 import blosc2_ext

        budget = plan.budget
        for schunk, cthreads, dthreads in plan.lowered:
            _set_threads(schunk, min(cthreads, budget), min(dthreads, budget))
        blosc2_ext.set_nthreads(min(plan.global_threads, budget))
        blosc2.nthreads = min(plan.default_threads, budget)


BACKEND = Blosc2Backend()
