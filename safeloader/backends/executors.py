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

_noted = threading.local()  # .executors: those the forking thread found in `before`


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


def _before() -> None:
    _noted.executors = _live_executors() if fork_context() is not None else []


def _after_in_parent() -> None:
    _noted.executors = []


def _after_in_child() -> None:
    executors, _noted.executors = getattr(_noted, "executors", []), []
    for executor in executors:
        executor._threads = set()
        executor._idle_semaphore = threading.Semaphore(0)
        executor._work_queue = queue.SimpleQueue()
        executor._shutdown_lock = threading.Lock()


class ExecutorsBackend(Backend):
    name = NAME
    description = "ThreadPoolExecutors held by the Dataset start their own threads in each worker"
    requires = ("concurrent.futures.thread",)
    before = _before
    after_in_parent = _after_in_parent
    after_in_child = _after_in_child


BACKEND = ExecutorsBackend
