"""What a stalled worker was doing: its stacks, collected by the parent (``collect``) from dumps the worker
writes when signalled, explained (``stall_causes``) and worded as a ``WorkerStallError`` (``message``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .. import native
from .._torch_internals import WORKER_LOOP_NAMES
from . import certain_causes, stacks
from .certain_causes import short_library
from .stacks import NativeThread, PythonThread
from .stall_causes import WatchedLoader, is_library_code, likely_cause, native_pool_cause

__all__ = ["StallReport", "WatchedLoader", "collect", "describe", "details", "likely_cause", "message",
           "native_pool_cause"]

PYTHON_DUMP_WAIT = 3.0
NATIVE_TOTAL_WAIT = 8.0
_WATCHDOG_PACKAGE = os.path.join("safeloader", "watchdog")
"""Where the watchdog's files are: a worker's frames in them are its heartbeat's wrappers."""


@dataclass
class StallReport:
    worker_id: int
    pid: int
    waited: float
    limit: float
    starting: bool
    items_done: int
    python_threads: list[PythonThread]
    python_text: str
    native_threads: list[NativeThread]
    native_available: bool
    cause: str = ""
    collating: int = 0
    """Items in the batch its collate_fn was collating; 0 when it was not collating."""
    batch: int = 1
    """Items the stuck call works on (a Dataset's __getitems__ gets the budget of each)."""
    certain: bool = False
    """Reported before its limit: it waits, unchanged and idle, or spins, in a library whose threads it lacks."""
    spinning: str = ""
    """The package it spins in (``certain``, at full CPU), '' where it waits idle."""
    waits_in: str | None = None
    """That library (read from the worker's stack through /proc, without its native stack dumper)."""
    stack_objects: tuple[str, ...] = ()
    """Without native stacks (no C extension): the loaded objects whose code the main thread's
    innermost stack points into, innermost first, read through /proc (C runtimes left out)."""

    @property
    def main_thread(self) -> PythonThread | None:
        return next((t for t in self.python_threads if t.main), None)

    def stuck_frames(self) -> list[tuple[str, int, str]]:
        """The main thread's frames, innermost first, without safeloader's own wrappers."""
        thread = self.main_thread
        if thread is None:
            return []
        frames = []
        for frame in thread.frames:
            if os.path.dirname(frame[0]).endswith(_WATCHDOG_PACKAGE):
                continue  # safeloader's own heartbeat wrappers (safeloader/watchdog/_progress.py)
            frames.append(frame)
            if frame[2] in WORKER_LOOP_NAMES:
                break  # what is outside is multiprocessing's process start
        return frames


# -- collecting ----------------------------------------------------------------------


def collect(
    worker_id: int,
    pid: int,
    waited: float,
    limit: float,
    starting: bool,
    items: float,
    python_path: str | None,
    native_path: str | None,
    watch: WatchedLoader,
    python_signal: int = 0,
    native_signal: int = 0,
    waits_in: str | None = None,
    explain: bool = True,
) -> StallReport:
    """Ask the stuck worker for its stacks (it runs signal handlers even when deadlocked): its dumpers'
    paths and signals, ``waits_in``, the library the watchdog saw its main thread wait in, and whether to
    ``explain`` (read the likely cause: not for a spin the watchdog confirmed)."""
    python_text, main_ident = "", None
    if python_path is not None and python_signal:
        python_text, main_ident = stacks.python_stacks(pid, python_path, PYTHON_DUMP_WAIT, python_signal)
    tids = stacks.thread_ids(pid)
    frames = {}
    if native_path is not None and native_signal:
        frames = stacks.native_stacks(pid, tids, native_path, time.monotonic() + NATIVE_TOTAL_WAIT, native_signal)
    report = StallReport(
        worker_id=worker_id,
        pid=pid,
        waited=waited,
        limit=limit,
        starting=starting,
        items_done=int(items),
        python_threads=stacks.parse_python(python_text, main_ident),
        python_text=python_text,
        native_threads=stacks.native_threads(pid, tids, frames),
        native_available=native_path is not None,
        waits_in=waits_in,
        stack_objects=() if native_path is not None else _objects_on_stack(pid),
    )
    if explain:
        report.cause = likely_cause(report, watch)
    return report


def _objects_on_stack(pid: int) -> tuple[str, ...]:
    from . import thread_owners

    found = dict.fromkeys(thread_owners.objects_on_stack(pid))  # each once, innermost first
    return tuple(name for name in found if not os.path.basename(name).startswith(("libpython", "python")))


# -- wording ------------------------------------------------------------------------


def _format_python(frames: list[tuple[str, int, str]], limit: int = 10) -> list[str]:
    lines = [f'    File "{file}", line {line}, in {func}' for file, line, func in frames[:limit]]
    if len(frames) > limit:
        lines.append(f"    ... {len(frames) - limit} outer frames")
    return lines


def _format_native(thread: NativeThread, limit: int = 12) -> list[str]:
    lines = [f"    #{i} {symbol} ({short_library(lib)})" for i, (lib, symbol) in enumerate(thread.frames[:limit])]
    if len(thread.frames) > limit:
        lines.append(f"    ... {len(thread.frames) - limit} outer frames")
    return lines


def _top_named_frame(thread: NativeThread) -> str:
    """Innermost named frame, and the innermost library that is not libc/Python (who is waiting)."""
    named = next(((lib, sym) for lib, sym in thread.frames if not sym.startswith("?")), None)
    text = f"{named[1]} ({short_library(named[0])})" if named else "?"
    owner = next((lib for lib, _ in thread.frames if not any(s in lib for s in stacks.SYSTEM_LIBRARIES)), None)
    if owner is not None and (named is None or owner != named[0]):
        text += f" called from {short_library(owner)}"
    return text


def describe(report: StallReport, full: bool = True) -> list[str]:
    """The report as text; ``full=False``: two lines (for a second worker stuck the same way)."""
    if report.starting:
        what = "starting (fork hooks, worker_init_fn)"
    elif report.collating:
        what = f"collating a batch of {report.collating} item(s) (collate_fn)"
    elif report.batch > 1:
        what = f"fetching a batch of {report.batch} items with __getitems__ (after {report.items_done} done)"
    elif report.items_done == 0:
        what = "fetching its first item"
    else:
        what = f"fetching an item (after {report.items_done} done)"
    lines = [
        f"DataLoader worker {report.worker_id} (pid {report.pid}) made no progress for {report.waited:.1f} s "
        f"while {what}; its limit was {report.limit:g} s.",
    ]
    if report.certain:
        lines[0] = certain_causes.headline(report.worker_id, report.pid, report.waited, what, report.spinning)
    stuck = report.stuck_frames()
    if stuck:
        where = f"  Stuck in {stuck[0][2]} ({stuck[0][0]}:{stuck[0][1]})"
        own = next((frame for frame in stuck if not is_library_code(frame[0])), None)
        if own is not None and own != stuck[0]:
            where += f", called from {own[2]} ({own[0]}:{own[1]})"
        lines.append(where + ("; Python stack, innermost first:" if full else "."))
        if full:
            lines += _format_python(stuck)
    elif not report.python_text:
        lines.append("  No Python stack: the worker hung before safeloader could install its stack dumper.")
    if not full:
        return lines
    lines.append(f"  Likely cause: {report.cause}")
    if not report.native_available:
        if native.NATIVE:
            lines.append("  Native stacks unavailable (no real-time signal was free in the worker for them).")
        else:
            lines.append("  Native stacks unavailable (safeloader's C extension is not built).")
    main = next((t for t in report.native_threads if t.tid == report.pid), None)
    if main is not None and main.frames:
        wait = main.kernel_wait or "?"
        lines.append(f"  Native stack of the main thread {main.tid} ({main.name}, kernel wait: {wait}):")
        lines += _format_native(main)
    others = [t for t in report.native_threads if t is not main]
    if others:
        lines.append("  Other threads of the worker (tid, name, kernel wait, innermost named native frame):")
        for thread in others:
            if not report.native_available:
                top = ""
            elif thread.frames:
                top = _top_named_frame(thread)
            else:
                top = "(no native stack: signals blocked or not answering)"
            lines.append(f"    {thread.tid} {thread.name} [{thread.kernel_wait or '?'}] {top}")
    return lines


def details(report: StallReport) -> str:
    """Everything collected: all Python stacks as faulthandler wrote them, all native stacks."""
    lines = describe(report)
    lines.append("  Python stacks of all threads (faulthandler):")
    lines += ["    " + line for line in report.python_text.splitlines()]
    for thread in report.native_threads:
        wait = thread.kernel_wait or "?"
        lines.append(f"  Native stack of thread {thread.tid} ({thread.name}, kernel wait: {wait}):")
        lines += _format_native(thread, limit=len(thread.frames))
    return "\n".join(lines)


def message(reports: list[StallReport], watch: WatchedLoader) -> str:
    lines = [f"safeloader: {len(reports)} DataLoader worker(s) stalled (stall_timeout={watch.stall_timeout:g} s)."]
    lines += describe(reports[0])
    for report in reports[1:]:
        same = report.cause == reports[0].cause
        lines += describe(report, full=not same)
        if same:
            lines.append("  Same likely cause.")
    lines.append(
        "All workers were shut down. If items legitimately take longer, pass a larger stall_timeout "
        "(seconds; the start and first item get "
        f"{watch.first_limit / watch.stall_timeout:g}x) or stall_timeout=None to turn the watchdog off. "
        "Every stack collected: the error's .details."
    )
    return "\n".join(lines)
