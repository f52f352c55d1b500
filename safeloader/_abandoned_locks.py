"""Locks an interrupted loader start can leave held by nobody, and their release.

CPython takes many of its locks in Python code (``with lock:``). A KeyboardInterrupt, or any
exception a signal handler raises, that lands between the acquire and the ``with`` block leaves
the lock held, and nothing will release it. In a loader start that was cut short (a Ctrl-C
storm, a SIGALRM timeout) two such locks hung the next start (``tests/children/interrupt_storm.py``):

- a queue's ``put`` (``multiprocessing.Queue._notempty``) during torch's prefetch: torch's own
  ``_shutdown_workers`` then waits forever in its ``put``;
- ``threading._active_limbo_lock`` in ``Thread.start`` (a queue's feeder thread, the watchdog's
  thread): every thread started later waits forever to register itself, and so does the
  ``start()`` that started it.

Both are released only for a start that was cut short, before its workers are shut down.
"""

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
        try:
            # Taken in time: it was free (give it back). Not taken: abandoned (release it).
            lock.acquire(timeout=HELD_BY_NOBODY_AFTER)
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
