"""Python thread pools the parent uses work in forked workers: ``concurrent.futures.ThreadPoolExecutor`` and
``multiprocessing.pool.ThreadPool`` (why: docs/internals.md)."""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any, NamedTuple

from .._context import ForkContext
from ._backend import Backend

NAME = "executors"

__all__ = ["BACKEND", "NAME"]


class _Plan(NamedTuple):
    executors: list[Any]
    """ThreadPoolExecutors with live threads."""
    thread_pools: list[Any]
    """multiprocessing.pool.ThreadPools still running."""


def _live_executors() -> list[Any]:
    thread_module = sys.modules.get("concurrent.futures.thread")
    worker = getattr(thread_module, "_worker", None)
    found: dict[int, Any] = {}
    for thread in threading.enumerate():
        if getattr(thread, "_target", None) is worker and worker is not None:
            args = getattr(thread, "_args", ())
            executor = args[0]() if args and callable(args[0]) else None  # a weakref to its executor
            if executor is not None:
                found[id(executor)] = executor
    return list(found.values())


def _live_thread_pools() -> list[Any]:
    """The running ``multiprocessing.pool.ThreadPool``s, wherever they are held (dask's documented
    ``dask.config.set(pool=ThreadPool(n))`` keeps one in its config): each registers its own
    termination with multiprocessing's finalizers, which hold a weak reference to it."""
    pool_module = sys.modules.get("multiprocessing.pool")
    util = sys.modules.get("multiprocessing.util")
    registry = getattr(util, "_finalizer_registry", None)
    if pool_module is None or not registry:
        return []
    terminate = pool_module.Pool._terminate_pool.__func__
    found = []
    for finalizer in list(registry.values()):
        if getattr(getattr(finalizer, "_callback", None), "__func__", None) is not terminate:
            continue
        reference = getattr(finalizer, "_weakref", None)
        pool = reference() if reference is not None else None
        if isinstance(pool, pool_module.ThreadPool) and pool._state == pool_module.RUN:
            found.append(pool)
    return found


def _restart_thread_pool(pool: Any) -> None:
    """Give the worker's copy of ``pool`` its own threads, queues and result cache, as a new ThreadPool of
    the same size, keeping the object (the parent's termination dropped, its own registered)."""
    from multiprocessing.pool import ThreadPool

    pool._terminate.cancel()
    ThreadPool.__init__(pool, pool._processes, getattr(pool, "_initializer", None), getattr(pool, "_initargs", ()))


class ExecutorsBackend(Backend):
    name = NAME
    description = "ThreadPoolExecutors and multiprocessing ThreadPools get their own threads in each worker"
    plan_per_start = True

    def before(self, ctx: ForkContext) -> _Plan | None:
        """The executors with live threads and the running thread pools, for the worker to make new."""
        if ctx is None:
            return None
        plan = _Plan(_live_executors(), _live_thread_pools())
        return plan if plan.executors or plan.thread_pools else self.NOTHING_TO_DO

    def after_in_child(self, ctx: ForkContext, plan: _Plan | None) -> None:
        if plan is None:
            return
        for executor in plan.executors:
            executor._threads = set()
            executor._idle_semaphore = threading.Semaphore(0)
            executor._work_queue = queue.SimpleQueue()
            executor._shutdown_lock = threading.Lock()
        for pool in plan.thread_pools:
            _restart_thread_pool(pool)


BACKEND = ExecutorsBackend()
