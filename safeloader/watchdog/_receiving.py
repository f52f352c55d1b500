"""The watchdog's checks while the main thread is blocked inside torch's receive of a batch.

torch's wait for a batch (``_try_get_data``) returns after its timeout when no batch comes, and the
parent's checks (``_parent._check``) run between two waits. A batch that has come is unpickled inside
that wait, though, and each tensor in it is fetched then from the worker that sent it: its file
descriptor, handed over by the worker's resource-sharer thread. A worker stopped after sending a batch
(SIGSTOP, a debugger), or hung in its next item holding its GIL (a native call that never returns and
never lets the GIL go), cannot answer: the main thread waits in a socket read for as long as that
lasts, and no check between two waits ever runs. torch's loader hangs there without a word.

``ReceiveWatcher`` is a thread of the parent, one per watched iterator, started after its workers
forked: while the main thread's wait lasts longer than it can without such a block, it runs the checks
itself. A stopped worker is named (``WorkerStoppedWarning``); a stalled one is reported, and the busy
workers killed, which ends the block (the read fails); the main thread then raises the report.

How it works and why: docs/internals.md, ``safeloader.watchdog``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["THREAD_NAME", "ReceiveWatcher"]

THREAD_NAME = "safeloader-receive-watch"
STOP_WAIT = 1.0
_NOT_WAITING = float("inf")
"""Seconds ``stop`` waits for the thread: in the middle of a check it may be collecting stacks."""


class ReceiveWatcher:
    """Runs ``find_stall(iterator)`` in a thread of its own while the main thread's wait for a batch
    outlasts its timeout; a stall found is kept in ``error`` after ``kill_busy(iterator)`` ended the
    block, for the main thread to raise.

    The main thread marks each wait with ``entering`` and ``left`` (two attribute writes: nothing is
    locked on the way of a batch). The thread holds the iterator weakly and ends with it, or at
    ``stop`` (the iterator's workers shut down).
    """

    def __init__(
        self,
        iterator: Any,
        interval: float,
        find_stall: Callable[[Any], BaseException | None],
        kill_busy: Callable[[Any], None],
        resume_all: Callable[[float], None],
    ) -> None:
        self.error: BaseException | None = None
        self.lock = threading.Lock()  # held by whichever thread runs the checks, this one or the main one
        self._late = _NOT_WAITING  # when the main thread's current wait is late (asked to return before)
        self._interval = interval
        self._iterator = weakref.ref(iterator)
        self._find_stall, self._kill_busy, self._resume_all = find_stall, kill_busy, resume_all
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def entering(self, timeout: float) -> None:
        """In the main thread: a wait of ``timeout`` seconds begins."""
        self._late = time.monotonic() + timeout + self._interval

    def left(self) -> None:
        """In the main thread: the wait returned or raised."""
        self._late = _NOT_WAITING

    def stop(self) -> None:
        """The iterator's workers are shut down: the thread ends, at once where it sleeps (waited for up
        to ``STOP_WAIT``; not from the thread itself, where the iterator's last reference may drop)."""
        self._stopped.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(STOP_WAIT)

    def _run(self) -> None:
        while True:
            slept_from = time.monotonic()
            if self._stopped.wait(self._interval):
                return
            woke = time.monotonic()
            if woke - slept_from > self._interval + max(1.0, self._interval):
                # This process was not running (a stopped job): nor, likely, were its workers, and a
                # forkserver's cannot be asked. Their clocks start again now, as the main thread's
                # wait does it (``_wait_watching``), which may run only after this thread's check.
                self._resume_all(woke)
                continue
            iterator = self._iterator()
            if iterator is None or self.error is not None:
                return
            if time.monotonic() > self._late and self.lock.acquire(blocking=False):
                try:  # not while the main thread checks (it does, at once, once its wait returns)
                    self.error = self._find_stall(iterator)
                    if self.error is not None:
                        self._kill_busy(iterator)  # the read of a killed worker's descriptor fails
                        return
                finally:
                    self.lock.release()
            del iterator  # not kept alive while this thread sleeps
