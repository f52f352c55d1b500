"""Imports other threads are running when a DataLoader worker forks (why: docs/internals.md)."""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any

MODULE_LOCKS: dict[str, Any] = getattr(sys.modules.get("importlib._bootstrap"), "_module_locks", {})
# (thread id, package) pairs already named in a warning: a thread importing a package is named once
# per process, not at every fork nor for each of the package's submodules.
_named: set[tuple[int, str]] = set()


def _held_by_other_threads(me: int) -> dict[str, Any]:
    """Module name -> its import lock, for each lock a thread other than ``me`` holds."""
    held = {}
    for name, ref in list(MODULE_LOCKS.items()):
        lock = ref() if callable(ref) else None
        owner = getattr(lock, "owner", None)
        if owner is not None and owner != me:
            held[name] = lock
    return held


def name_imports_in_other_threads() -> None:
    """In the parent, before a worker fork: warn once per thread and package of an import another
    thread is running. The fork does not wait for it (the worker imports it afresh if it needs it:
    ``forget_imports_of_other_threads``), as torch's loader does not wait."""
    if not MODULE_LOCKS:  # no import running anywhere (or nothing known to look at)
        return
    importing: dict[int, list[str]] = {}
    for name, lock in _held_by_other_threads(threading.get_ident()).items():
        importing.setdefault(lock.owner, []).append(name)
    for owner, names in importing.items():
        package = min(names, key=len).partition(".")[0]  # the outermost import: what the thread asked for
        if (owner, package) in _named:
            continue
        _named.add((owner, package))
        thread = threading._active.get(owner)  # type: ignore[attr-defined]  # threading's own table
        who = f"thread {thread.name!r}" if thread is not None else f"native thread {owner}"
        now = max(names, key=len)
        where = f", now at {now}" if now != package else ""
        warnings.warn(
            f"safeloader: another thread has been importing {package} when DataLoader workers forked "
            f"({who}{where}); not waited for, as torch's loader does not wait: a worker that imports "
            f"{package} imports it afresh (import it before starting the loader to avoid that)",
            RuntimeWarning,
            stacklevel=3,
        )


def forget_imports_of_other_threads() -> None:
    """In a just-forked worker: drop the import locks (and unfinished modules) of threads it does not
    have; the forking thread's own stay (why: docs/internals.md, ``safeloader._import_locks``)."""
    if not MODULE_LOCKS:
        return
    for name in _held_by_other_threads(threading.get_ident()):
        MODULE_LOCKS.pop(name, None)
        module = sys.modules.get(name)
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            del sys.modules[name]
