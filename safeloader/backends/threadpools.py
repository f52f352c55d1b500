"""The "threadpools" backend: a thread budget for BLAS and OpenMP pools in each worker (the pools:
``_blas_pools``) (why: docs/internals.md)."""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from .. import _hooks, forkstate
from .._context import ForkContext
from .._options import Options
from ..diagnostics.native_libraries import Library
from . import _blas_pools, _gomp_pause, _torch_threads
from ._backend import Backend
from ._blas_pools import Pool

NAME = "threadpools"

__all__ = ["BACKEND", "NAME", "status", "stop_openblas_servers"]


@functools.cache
def _threadpoolctl_installed() -> bool:
    return importlib.util.find_spec("threadpoolctl") is not None


def status() -> str:
    """Whether the backend can act in this environment, in words."""
    if not _threadpoolctl_installed():
        return (
            "inactive: threadpoolctl is not installed, so BLAS/OpenMP pools in workers are not limited "
            "(pip install torch-safeloader[threadpoolctl])"
        )
    return "active: BLAS/OpenMP pools in each worker are limited to the thread budget"


@dataclass(frozen=True)
class _Plan:
    """Decided in the parent before a fork; the worker inherits it and only applies it."""

    limits: tuple[tuple[Pool, int], ...]
    """(pool, threads) for each pool."""
    torch_threads: int
    torch_pinned: str
    """Why more than 1 thread of torch's OpenMP runtime would hang in the worker: the parent's pool
    of it could not be released ('' when it was, or there was none)."""
    unreleased: tuple[tuple[str, str], ...] = ()
    """(libgomp copy, why) for each GNU OpenMP pool of the parent's that could not be released: its
    workers' OpenMP stays at 1 thread, which a library setting its own count overrides."""


def _plan(unreleased: dict[str, str], pools: tuple[Pool, ...], budget: int, torch_threads: int) -> _Plan:
    """The worker's limits: the budget, but 1 thread for a GNU OpenMP copy in ``unreleased`` (a
    pool of the parent's that could not be released, with why), where more would hang."""
    limits = []
    torch_has_openmp = False
    torch_pinned = ""
    for pool in pools:
        pinned = unreleased.get(pool.path, "") if pool.openmp else ""
        threads = 1 if pinned else budget
        # A budget only ever lowers a pool.
        if threads < _blas_pools.thread_count(pool) and _blas_pools.lowers_in_place(pool):
            limits.append((pool, threads))
        if pool.in_torch:
            torch_has_openmp = True  # the runtime bundled in torch's wheel
            torch_pinned = torch_pinned or pinned
    if not torch_has_openmp and unreleased:
        # torch uses a shared OpenMP runtime (conda, system libgomp), or we
        # cannot tell which: any pinned runtime pins torch too.
        torch_pinned = next(iter(unreleased.values()))
    return _Plan(tuple(limits), 1 if torch_pinned else torch_threads, torch_pinned, tuple(unreleased.items()))


def _unreleased_message(path: str, why: str) -> str:
    return (
        f"safeloader: the GNU OpenMP pool of {os.path.basename(path)} ({path}) could not be released before "
        f"forking DataLoader workers: {why}. Its workers' OpenMP threads are limited to 1, but a library that "
        "sets its own OpenMP thread count (an n_jobs or num_threads argument) makes a worker wait forever in "
        "its next parallel region. Start the loader outside OpenMP parallel regions, or use "
        "multiprocessing_context='forkserver' (or 'spawn')."
    )


class ThreadpoolsBackend(Backend):
    name = NAME
    description = ("each worker's BLAS/OpenMP pools are limited to the thread budget; the parent's GNU OpenMP pool "
                   "is released before each fork")
    plan_per_start = True
    libraries = (
        Library(
            ("libgomp",),
            label="GNU OpenMP (libgomp)",
            hazard="A worker running a parallel region with >1 thread would hang",
            stall="the worker entered an OpenMP parallel region after the parent had run one; libgomp's thread "
            "pool does not survive fork and the region waits forever.",
            remedy="keep workers at 1 OpenMP thread (torch.set_num_threads(1) in worker_init_fn) if no library "
            "there sets its own count (an n_jobs or num_threads argument)",
        ),
        Library(("libopenblas", "libscipy_openblas"), label="OpenBLAS", alone="it restarts its threads in a child"),
        Library(("libomp", "libiomp"), label="LLVM/Intel OpenMP", alone="it restarts its threads in a child"),
        Library(("libmkl", "libblis", "libflexiblas"), alone="it restarts its threads in a child"),
    )

    def __init__(self) -> None:
        self._pools = _blas_pools.PoolFinder()  # filled in the parent, inherited: a worker only sets counts
        self._warned_inactive = False
        self._warned_unreleased: set[str] = set()  # libgomp copies already warned about in this process

    def before(self, ctx: ForkContext) -> _Plan | None:
        if ctx is None:
            return None
        budget = ctx.options.threads_per_worker(ctx.num_workers)
        # torch's own threads get a budget only when the user set one: torch.set_num_threads(n > 1)
        # starts n - 1 threads of torch's at once (its pthreadpool), in every worker at its start
        # (1.17x torch's warm start with 16 cores and 4 workers, against 1.11x without).
        torch_threads = budget if ctx.options.thread_budget is not None else 1
        state = forkstate.record(ctx)
        # GNU OpenMP: a pool this thread started would be the worker's, counting threads it does not
        # have. Released here, on the forking thread, right before the fork (only where a pool may be
        # live): the worker has none, whatever thread count a library sets there later.
        unreleased = _gomp_pause.release(state.gomp_unsafe, state.libraries) if state.gomp_unsafe else {}
        if unreleased:
            self._warn_unreleased(unreleased)
        return _plan(unreleased, self._pools.pools(state.libraries), budget, torch_threads)

    def _warn_unreleased(self, unreleased: dict[str, str]) -> None:
        """Say once per copy and process that a pool stays (here, before the fork: this hook's plan holds
        for the whole start, so it has no after_in_parent)."""
        import warnings

        for path, why in unreleased.items():
            if path not in self._warned_unreleased:
                self._warned_unreleased.add(path)
                warnings.warn(_unreleased_message(path, why), RuntimeWarning, stacklevel=2)

    def after_in_child(self, ctx: ForkContext, plan: _Plan | None) -> None:
        if plan is None:
            return
        for pool, threads in plan.limits:
            _blas_pools.lower_threads(pool, threads)
        if plan.torch_threads > 1 or plan.torch_pinned:  # else torch's worker loop sets 1 itself
            _torch_threads.guard_torch_threads(plan.torch_threads, plan.torch_pinned)

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        """Say once that a ``thread_budget`` the user set cannot be applied without threadpoolctl."""
        if self._warned_inactive or _threadpoolctl_installed():
            return
        if options.thread_budget is not None and NAME not in options.disable_hooks:
            import warnings

            self._warned_inactive = True
            warnings.warn(f"safeloader: thread_budget={options.thread_budget} is ignored; {status()}", stacklevel=2)

    def status(self) -> str:
        return status()

    def register(self) -> _hooks.Hook | None:
        # Without threadpoolctl the hook stays listed but inactive (Hook.active is
        # False) until threadpoolctl is imported, which means it got installed.
        self.requires = () if _threadpoolctl_installed() else ("threadpoolctl",)  # type: ignore[misc]
        return super().register()


def stop_openblas_servers() -> int:
    """In the parent, right before it forks a loader's workers: each pthreads OpenBLAS's threads
    stopped as its own fork handler would stop them at that fork (``_blas_pools``); how many copies."""
    return _blas_pools.stop_openblas_servers(BACKEND._pools.pools(forkstate.loaded_libraries()))


BACKEND = ThreadpoolsBackend()
