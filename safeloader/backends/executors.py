"""``concurrent.futures.ThreadPoolExecutor``s a Dataset holds work in forked workers.

How it works and why: docs/internals.md, ``safeloader.backends.executors``.
"""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any

from .. import hook_names
from .._registry import fork_context
from ._backend import Backend

NAME = hook_names.EXECUTORS

__all__ = ["BACKEND", "NAME"]

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


class ExecutorsBackend(Backend):
    name = NAME
    description = "ThreadPoolExecutors held by the Dataset start their own threads in each worker"
    plan_per_start = True
    requires = ("concurrent.futures.thread",)

    def before(self) -> list[Any] | None:
        """The executors with live threads, for the worker to make new."""
        return _live_executors() if fork_context() is not None else None

    def after_in_child(self, plan: list[Any] | None) -> None:
        for executor in plan or ():
            executor._threads = set()
            executor._idle_semaphore = threading.Semaphore(0)
            executor._work_queue = queue.SimpleQueue()
            executor._shutdown_lock = threading.Lock()


BACKEND = ExecutorsBackend()
