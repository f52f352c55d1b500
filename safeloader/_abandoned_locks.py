"""Locks an interrupted loader start can leave held by nobody, and their release (why: docs/internals.md)."""

from __future__ import annotations

import threading
from typing import Any

HELD_BY_NOBODY_AFTER = 0.5
"""Seconds a queue's lock may stay held before it counts as abandoned (its feeder thread holds it
for microseconds at a time)."""


def release_queue_locks(iterator: Any) -> None:
    """Release the locks of the iterator's queues that an interrupted ``put`` left held."""
    queues = [*getattr(iterator, "_index_queues", ()), getattr(iterator, "_worker_result_queue", None)]
    for queue in queues:
        lock = getattr(getattr(queue, "_notempty", None), "_lock", None)  # threading.Condition's lock
        if lock is None:
            continue
        # Taken in time: it was free (give it back). Not taken: abandoned (release it). A signal
        # handler's error raised while waiting (torch's SIGCHLD one is a RuntimeError) is not
        # caught here: the caller runs this again (caught, the lock stayed held: issue 42's storm).
        lock.acquire(timeout=HELD_BY_NOBODY_AFTER)
        try:
            lock.release()
        except RuntimeError:  # released meanwhile: it was not abandoned after all
            pass


def release_threading_lock() -> None:
    """Release ``threading``'s registry lock if this thread still holds it: no caller of a
    loader start is inside ``threading``'s own ``with _active_limbo_lock`` blocks, so a hold
    here is one an interrupt abandoned."""
    lock: Any = getattr(threading, "_active_limbo_lock", None)
    is_owned = getattr(lock, "_is_owned", None)
    while is_owned is not None and is_owned():
        lock.release()
