"""Imports other threads are running when a DataLoader worker forks.

How it works and why: docs/internals.md, ``safeloader._import_locks``.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
import weakref
from typing import Any

# How long a worker fork waits for imports running in other threads.
IMPORT_WAIT_SECONDS = 5.0
# Import locks a fork already waited IMPORT_WAIT_SECONDS for: later forks do not wait
# for them again (a thread stuck in an import must not cost every worker 5 s).
_outlasted_imports: weakref.WeakSet[Any] = weakref.WeakSet()
MODULE_LOCKS: dict[str, Any] = getattr(sys.modules.get("importlib._bootstrap"), "_module_locks", {})


def _held_by_other_threads(me: int) -> dict[str, Any]:
    """Module name -> its import lock, for each lock a thread other than ``me`` holds."""
    held = {}
    for name, ref in list(MODULE_LOCKS.items()):
        lock = ref() if callable(ref) else None
        owner = getattr(lock, "owner", None)
        if owner is not None and owner != me:
            held[name] = lock
    return held


def wait_for_imports_in_other_threads() -> None:
    """In the parent, before a worker fork: let the imports other threads are running finish.

    Waits at most ``IMPORT_WAIT_SECONDS`` per import, then forks with a warning
    naming the module (the worker imports it again itself if it needs it).
    """
    if not MODULE_LOCKS:  # no import running anywhere (or nothing known to wait for)
        return
    me = threading.get_ident()
    deadline = None
    while True:
        busy = [lock for lock in _held_by_other_threads(me).values() if lock not in _outlasted_imports]
        if not busy:
            return
        now = time.monotonic()
        if deadline is None:
            deadline = now + IMPORT_WAIT_SECONDS
        elif now > deadline:
            break
        time.sleep(0.001)
    names = ", ".join(sorted(str(getattr(lock, "name", "?")) for lock in busy))
    for lock in busy:
        _outlasted_imports.add(lock)
    warnings.warn(
        f"safeloader: another thread has been importing {names} for more than {IMPORT_WAIT_SECONDS:g} s; "
        "forking the DataLoader worker anyway (a worker that needs it imports it again: import it "
        "before starting the loader to avoid that)",
        RuntimeWarning,
        stacklevel=3,
    )


def forget_imports_of_other_threads() -> None:
    """In a just-forked worker: drop the import locks (and unfinished modules) of threads it does not have.

    Only the forking thread survives a fork, so every lock another thread held
    is held forever here. Dropping it from importlib's table makes the next
    import of that name take a fresh lock; dropping the module if it was still
    executing (``__spec__._initializing``) makes that import run it again, as
    importlib does after a failed import. Locks the forking thread itself
    holds (a loader started during an import) stay.
    """
    if not MODULE_LOCKS:
        return
    for name in _held_by_other_threads(threading.get_ident()):
        MODULE_LOCKS.pop(name, None)
        module = sys.modules.get(name)
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            del sys.modules[name]
