"""The fork context safeloader hands torch for a start: torch's own, but for its workers' done event,
which a Ctrl-C cannot leave locked (why: docs/internals.md, ``safeloader._done_event``)."""

from __future__ import annotations

import multiprocessing.context
import multiprocessing.synchronize
from typing import Any

SET_WAIT = 1.0
"""Seconds ``set`` waits for the event's lock before it raises the flag without it."""


class DoneEvent(multiprocessing.synchronize.Event):
    """torch's ``_workers_done_event`` (its workers ask ``is_set`` for every index; the parent calls
    ``set`` once, at shutdown; nobody ``wait``s on it), without its lock where it can be left held.

    multiprocessing's Event reads and raises its flag under a lock shared with the workers. A Ctrl-C
    sent to the process group lands in a worker between that lock's acquire and the ``with`` that
    would release it; torch's worker loop catches the KeyboardInterrupt and asks ``is_set`` again,
    waiting for ever on the lock it holds, and so does the parent's ``set`` at the iterator's end
    (interrupt storms with files held: 3 hangs in 5 runs of 300 starts)."""

    def is_set(self) -> bool:
        try:
            return self._flag.get_value() > 0  # type: ignore[attr-defined]  # sem_getvalue: no lock
        except NotImplementedError:  # no sem_getvalue (macOS): as multiprocessing does
            return super().is_set()

    def set(self) -> None:
        cond: Any = self._cond  # type: ignore[attr-defined]
        if cond.acquire(timeout=SET_WAIT):
            try:
                self._flag.acquire(False)  # type: ignore[attr-defined]
                self._flag.release()  # type: ignore[attr-defined]
                cond.notify_all()
            finally:
                cond.release()
        elif not self.is_set():  # its lock left held by a process an interrupt cut short: no waiter to wake
            self._flag.release()  # type: ignore[attr-defined]


class DoneEventForkContext(multiprocessing.context.ForkContext):
    """The fork context, with ``Event`` making ``DoneEvent``s (torch makes one per iterator)."""

    def Event(self) -> DoneEvent:
        return DoneEvent(ctx=self.get_context())


CONTEXT = DoneEventForkContext()


def for_start(context: Any) -> Any:
    """The context to give torch for a fork start where the loader has ``context``: ours where that
    is torch's default or the plain fork context, else the user's own, as it is."""
    if context is None or type(context) is multiprocessing.context.ForkContext:
        return CONTEXT
    return context
