"""Work that holds glibc's dynamic-loader lock, and forks from other threads, without either waiting for the
other's at-fork callbacks (why: docs/internals.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Module state: glibc's loader lock is the process's.
# A C lock, entered only with ``with _lock`` over a few bytecodes: a signal handler's exception
# (Ctrl-C) cannot leave it held, as it can a Condition's, whose enter and wait are Python code.
_lock = threading.Lock()
_released = 0  # sections running with the GIL released
_forking: dict[int, int] = {}  # thread ident -> forks it is inside (between before and after_in_parent)


def enter_fork() -> None:
    """In a fork's ``before`` phase: wait for sections running with the GIL released,
    then count this thread as forking."""
    me = threading.get_ident()
    while True:
        with _lock:
            if not _released:
                _forking[me] = _forking.get(me, 0) + 1
                return
        time.sleep(0.0002)  # a section is short: it holds the loader lock


def leave_fork() -> None:
    """In the parent, after the fork (``after_in_parent``): this thread is no longer forking."""
    me = threading.get_ident()
    with _lock:
        count = _forking.pop(me, 0) - 1
        if count > 0:
            _forking[me] = count


def idle() -> bool:
    """No thread is counted as inside a fork and no section runs (for tests: nothing outlived a fork)."""
    with _lock:
        return not _forking and not _released


def reset_in_child() -> None:
    """In the child: the other threads are gone, and with them their sections and forks. What
    shows none is kept as inherited (replacing it would write pages copied from the parent)."""
    global _lock, _released, _forking
    if _lock.locked():
        _lock = threading.Lock()
    if _released:
        _released = 0
    if _forking:
        _forking = {}


def section(work: Callable[[bool], T]) -> T:
    """``work(release)``, for work that holds the loader lock: ``release`` is True when it may release the GIL
    (forks starting meanwhile wait for it), False when it must keep it (a function, not a context manager:
    its objects would write pages the workers share)."""
    global _released
    me = threading.get_ident()
    counted = False  # set with the count, in straight-line code: an interrupt cannot fall between
    try:
        with _lock:
            release = _may_release(me)
            if release:
                _released += 1
                counted = True
        return work(release)
    finally:
        if counted:
            with _lock:
                _released -= 1


def _may_release(me: int) -> bool:
    """Whether no thread but ``me`` is inside a fork (``_lock`` held)."""
    for ident in _forking:
        if ident != me:
            return False
    return True
