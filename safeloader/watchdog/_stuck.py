"""Busy workers certain never to progress, named long before ``stall_timeout``: one idle in a library
whose threads it lacks, one spinning in such a library without finishing an item.

How it works and why: docs/internals.md, ``safeloader.watchdog._stuck``.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["ORPHAN_CONFIRM", "ORPHAN_IDLE_TICKS", "ORPHAN_WAIT", "StuckWorkers"]

ORPHAN_WAIT = 3.0
"""Seconds without progress after which a busy worker is looked at."""
ORPHAN_CONFIRM = 2.0
"""Seconds the same wait (or the same spin) must then last, to be certain."""
ORPHAN_IDLE_TICKS = 10
"""CPU ticks (10 ms) the whole worker may use meanwhile (a helper thread's timer); a pool at work
for the main thread uses far more."""

Found = tuple[int, float, float, float, float, float]  # as Watch.stalled gives them


def _interpreter(path: str) -> bool:
    return path[path.rfind("/") + 1 :].startswith(("libpython", "python"))


SPIN_WINDOW_MAX = 32.0  # seconds: a worker computing for minutes is sampled at most twice a minute


class StuckWorkers:
    """Per worker, the wait (or the spin) first seen and when; kept by the parent's ``Watch``."""

    def __init__(self) -> None:
        # worker -> (the syscall line, CPU ticks, when first seen, the library)
        self.waits: dict[int, tuple[str, int, float, str]] = {}
        # worker -> (CPU ticks, when first seen running)
        self.runs: dict[int, tuple[int, float]] = {}
        self.spins_in: dict[int, str] = {}  # worker -> the package its spin was confirmed in
        # worker -> seconds of CPU without an item before its next sampling: doubled after each
        # sampling that found no spin, so that a long CPU-bound item is interrupted ever more rarely.
        self.spin_windows: dict[int, float] = {}
        self.trusted: frozenset[str] = frozenset()  # libraries live in the parent that the table calls safe
        self._trusted_at = -1.0

    def next_due(self) -> float:
        """When the first window ``idle`` or ``spinning`` keeps open ends (inf: none is open)."""
        ends = [seen[2] + ORPHAN_CONFIRM for seen in self.waits.values()]
        windows = self.spin_windows
        ends += [start + windows.get(worker_id, ORPHAN_CONFIRM) for worker_id, (_, start) in self.runs.items()]
        return min(ends, default=float("inf"))

    def forget(self, worker_id: int) -> None:
        self.waits.pop(worker_id, None)
        self.runs.pop(worker_id, None)
        self.spins_in.pop(worker_id, None)
        self.spin_windows.pop(worker_id, None)

    def live_libraries(self, lacking: frozenset[str], now: float) -> frozenset[str]:
        """Every library with native threads in this process (the workers' parent), whatever the table
        says of it: asked again at most once a confirm window (a thread's owner is kept once found)."""
        if now - self._trusted_at >= ORPHAN_CONFIRM:
            from ..diagnostics import thread_owners

            self.trusted = frozenset(thread_owners.live_libraries()) - lacking
            self._trusted_at = now
        return self.trusted

    def idle(self, worker_id: int, pid: int, lacking: frozenset[str], now: float) -> bool:
        """Whether worker ``worker_id`` (``pid``) has waited, unchanged and near idle, for
        ``ORPHAN_CONFIRM`` inside a library whose threads its parent runs.

        A library the workers were forked lacking (``lacking``: no backend resets it, the table does not
        know it to survive) counts on the main thread's wait alone. Any other library with threads in the
        parent (the table says a backend handles it, or that it survives fork) counts only when every
        thread of the worker waits in a futex: nothing in the worker waits for the outside (a read, a
        poll, a timer) that could wake the rest. The table can be wrong (a library setting its own thread
        count on every call, a pool that survives only when idle at the fork); what the worker shows cannot.
        """
        from ..diagnostics import thread_owners

        wait = thread_owners.wait_in(pid, lacking) if lacking else None
        if wait is None:
            wait = self._waits_in_trusted(pid, self.live_libraries(lacking, now))
        if wait is None:
            self.waits.pop(worker_id, None)
            return False
        seen = self.waits.get(worker_id)
        if seen is None or seen[0] != wait[0] or wait[2] - seen[1] > ORPHAN_IDLE_TICKS:
            self.waits[worker_id] = (wait[0], wait[2], now, wait[1])
            return False
        return now - seen[2] >= ORPHAN_CONFIRM

    @staticmethod
    def _waits_in_trusted(pid: int, trusted: frozenset[str]) -> tuple[str, str, int] | None:
        """As ``thread_owners.wait_in``, for the libraries the table calls safe: one of them must lie on
        the main thread's stack inside any interpreter frame (a wait of Python's own, on a lock another
        process may release, has the interpreter innermost), and every thread of the worker must wait
        in a futex."""
        from .. import native
        from ..diagnostics import thread_owners, worker_threads

        objects = thread_owners.objects_on_stack(pid) if trusted else []
        library = next((name for name in objects if name in trusted or _interpreter(name)), None)
        if library is None or _interpreter(library) or not worker_threads.all_wait_in_futex(pid):
            return None
        ticks = worker_threads.cpu_ticks(pid)
        try:
            line = native.read_proc(f"/proc/{pid}/syscall").strip()
        except OSError:
            return None
        return (line, library, ticks) if ticks is not None else None

    def spinning(self, worker_id: int, pid: int, lacking: frozenset[str], now: float, sample: Any) -> bool:
        """Whether worker ``worker_id`` (``pid``) has run for ``ORPHAN_CONFIRM`` without finishing an item
        (more CPU than ``ORPHAN_IDLE_TICKS``: on a loaded machine a spinning worker gets a small share),
        its main thread found at most of a few native samples (``sample()``: its frames, taken only while
        it runs out of any system call, its Python frames read from outside; or None) in the same
        library's code calling back into the interpreter, a library of a distribution whose
        native threads run in the parent: a retry loop on a handle inherited without its threads (pyzmq's
        context after a fork answers every call with EINTR, which pyzmq retries for ever). A slow item
        computing in native code (numpy, torch) does not call back into the interpreter from there; one
        running Python code is in no such library's code.
        """
        from ..diagnostics import spin_samples, worker_threads

        ticks = worker_threads.cpu_ticks(pid)
        if ticks is None:
            self.runs.pop(worker_id, None)
            return False
        seen = self.runs.get(worker_id)
        if seen is None:
            self.runs[worker_id] = (ticks, now)
            return False
        window = self.spin_windows.get(worker_id, ORPHAN_CONFIRM)
        if now - seen[1] < window:
            return False
        if ticks - seen[0] <= ORPHAN_IDLE_TICKS:
            self.runs[worker_id] = (ticks, now)  # not running: start the window again
            return False
        package = spin_samples.spinning_in(sample, self.live_libraries(lacking, now) | lacking)
        if package is None:  # the next window starts after the sampling, which took a while
            self.runs[worker_id] = (ticks, time.monotonic())
            self.spin_windows[worker_id] = min(2 * window, SPIN_WINDOW_MAX)
            return False
        self.spins_in[worker_id] = package
        return True
