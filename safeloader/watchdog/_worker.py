"""The watchdog's side in each worker, as it starts: its heartbeat begun (``_progress``), the two
stack dumpers the parent signals once it stalls installed (on real-time signals nobody holds, into
memfds), a batch its result queue cannot send reported, the end of its start marked. The watchdog's
fork hook (``register``) times each worker's start in the parent and enters the forked worker; a
spawn/forkserver worker enters in safeloader's ``worker_init_fn``.

How it works and why: docs/internals.md, ``safeloader.watchdog``.
"""

from __future__ import annotations

import _signal  # signal.getsignal converts each answer to an enum (1-2 us a call, in every worker)
import _thread
import errno
import faulthandler
import os
import resource  # here, not in each worker: an import there costs it 0.1 ms
import time
from typing import Any

from .. import _hooks, hook_names, native
from .._context import ForkContext
from .._hooks import FastFork
from . import _progress
from ._heartbeat import (
    FIELDS,
    IDLE,
    LAST,
    NATIVE_FD,
    NATIVE_READY,
    NATIVE_SIGNAL,
    PYTHON_FD,
    PYTHON_READY,
    PYTHON_SIGNAL,
    PYTHON_STATE,
    READY,
    SEND_ERRNO,
    STATE,
    Heartbeats,
)

__all__ = [
    "DESCRIPTORS_LOW",
    "enter_worker",
    "prepare_forks",
    "register",
    "watch_result_queue",
    "worker_ready",
]


def enter_worker(watch: Heartbeats, worker_id: int) -> None:
    """In worker ``worker_id``: install the stack dumpers and the heartbeat. Idempotent."""
    beat = _progress.current_beat()
    if beat is not None and beat.watch is watch:
        return
    base = worker_id * FIELDS
    python_fd, native_fd, ready = -1, -1, 0
    python_signal = native_signal = python_handler = 0
    try:
        if not _ample_descriptor_limit and _few_spare_descriptors():
            raise OSError(errno.EMFILE, "fewer than 64 spare file descriptors: no stack dumps")
        # Two real-time signals nobody holds in this worker now: a handler the user
        # installed (inherited, or by faulthandler) keeps its signal.
        signals = native.free_signals(2)
        if signals:
            python_signal = signals[0]
            # Open for the worker's life; faulthandler takes the bare descriptor (a file object
            # would cost each worker the io stack's objects: pages copied from the parent).
            python_fd = os.memfd_create("safeloader-python-stacks")
            # faulthandler names threads by ident; the parent needs to know which is main: this
            # one (the forked worker's only thread, or a spawned worker's loop), asked of C alone.
            os.write(python_fd, b"main-thread %#x\n" % _thread.get_ident())
            faulthandler.register(python_signal, file=python_fd, all_threads=True, chain=False)
            # Its handler leaves errno as its writes set it (CPython restores errno only with
            # chain=True): wrapped in one that restores it, where the signal lands between a
            # library's failed call and its check of errno (csrc/backtrace.c).
            native.keep_errno(python_signal)
            python_handler = native.signal_handler_address(python_signal)
            watch.slots[base + PYTHON_FD] = float(python_fd)
            watch.slots[base + PYTHON_SIGNAL] = float(python_signal)
            ready = PYTHON_READY
        if len(signals) == 2 and native.NATIVE:
            native_fd = os.memfd_create("safeloader-native-stacks")
            watch.slots[base + NATIVE_FD] = float(native_fd)
            if native.install_backtrace_handler(signals[1], native_fd):
                native_signal = signals[1]
                watch.slots[base + NATIVE_SIGNAL] = float(native_signal)
                ready |= NATIVE_READY
    except OSError:
        # Out of descriptors (EMFILE) or no memfd: the heartbeat still works,
        # a stall is still reported, without stacks. The worker's own data
        # path needs the descriptors more than diagnostics do.
        pass
    # Where the parent reads this thread's Python frames from outside (a spin's samples).
    watch.slots[base + PYTHON_STATE] = float(native.thread_state())
    beat = _progress.start_beat(watch, base, python_fd, native_fd)
    native_handler = native.signal_handler_address(native_signal) if native_signal else 0
    beat.signals = (python_signal, python_handler, native_signal, native_handler)
    _progress.instrument_fetchers()  # a forked worker inherits the parent's (prepare_forks)
    watch.slots[base + READY] = float(ready)


def watch_result_queue(watch: Heartbeats, worker_id: int, queue: Any) -> None:
    """In the worker: a batch its result queue fails to send is reported to the parent."""
    slots, base = watch.slots, worker_id * FIELDS
    report = getattr(queue, "_on_queue_feeder_error", None)
    if report is None:
        return

    def on_send_error(error: BaseException, obj: Any) -> None:
        number = getattr(error, "errno", None) or -1
        if number not in (errno.EMFILE, errno.ENFILE) and _out_of_descriptors():
            # What failed may not say so: tempfile, out of descriptors, raises
            # "No usable temporary directory" (ENOENT) when torch shares a tensor.
            number = errno.EMFILE
        slots[base + SEND_ERRNO] = float(number)
        report(error, obj)  # multiprocessing's own: prints the traceback

    # Read by the queue when its feeder thread starts, at the first put: after this.
    queue._on_queue_feeder_error = on_send_error


def worker_ready(watch: Heartbeats, worker_id: int) -> None:
    """In the worker: its start (hooks, ``worker_init_fn``) is done; it waits for work.

    A stack dumper whose signal got another handler meanwhile (the user's
    ``worker_init_fn`` installed one on it) is given up: the parent will not
    send that signal, and the user's handler keeps it.
    """
    base = worker_id * FIELDS
    beat = _progress.current_beat()
    if beat is not None and beat.watch is watch and beat.signals != (0, 0, 0, 0):
        python_signal, python_handler, native_signal, native_handler = beat.signals
        ready = int(watch.slots[base + READY])
        if python_signal and not _still_held(python_signal, python_handler):
            ready &= ~PYTHON_READY
        if native_signal and not _still_held(native_signal, native_handler):
            ready &= ~NATIVE_READY
        watch.slots[base + READY] = float(ready)
    watch.slots[base + LAST] = time.monotonic()
    watch.slots[base + STATE] = IDLE


def _still_held(signum: int, handler: int) -> bool:
    """Whether the handler installed on ``signum`` (at ``handler``) is still the one there."""
    try:
        return native.signal_handler_address(signum) == handler and _signal.getsignal(signum) == _signal.SIG_DFL
    except (OSError, ValueError):
        return False


def prepare_forks() -> None:
    """In the parent, before it forks watched workers: what each would otherwise do for itself,
    done once here and inherited done."""
    global _ample_descriptor_limit
    _ample_descriptor_limit = _descriptor_limit()[1]
    native.warm_backtrace()
    _progress.instrument_fetchers()


# -- file descriptors: the worker's data path needs them more than its stack dumps -------


def _spare_descriptors() -> float:
    """How many more file descriptors this process may open (0 when it cannot even list them)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return float("inf")
    try:
        return float(soft - len(os.listdir("/proc/self/fd")))
    except OSError:
        return 0.0


# Set in the parent before forking workers (``prepare_forks``), inherited: the limit is
# the parent's, and a worker then need not ask again.
_ample_descriptor_limit = False


def _descriptor_limit() -> tuple[int, bool]:
    """(the soft open-file limit, whether it is one of the usual, ample ones)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, soft == resource.RLIM_INFINITY or soft >= 4096


def _few_spare_descriptors() -> bool:
    """Whether this process is close to its open-file limit (then the worker's data
    path gets the descriptors, and a stall is reported without stacks)."""
    if _ample_descriptor_limit:
        return False  # the parent found one of the usual limits: no need to ask or count
    _, ample = _descriptor_limit()
    if ample:
        return False
    return _spare_descriptors() < 64


# A failed send counts as "out of descriptors" when fewer than this many are left.
DESCRIPTORS_LOW = 8


def _out_of_descriptors() -> bool:
    """Whether this process has (nearly) run out of file descriptors, the usual cause of a lost batch."""
    return _spare_descriptors() < DESCRIPTORS_LOW


# -- the watchdog's fork hook ----------------------------------------------------------


def _start_clock_at_fork(ctx: ForkContext | None) -> None:
    """In the parent, last before a worker fork: its start is timed from now.

    The Watch was created before the first fork; another hook may have waited
    long since (for a lock another thread held), and that is not the worker's time.
    """
    if ctx is not None and isinstance(ctx.watch, Heartbeats):
        ctx.watch.slots[ctx.worker_id * FIELDS + LAST] = time.monotonic()


def _enter_worker_at_fork(ctx: ForkContext | None, plan: None) -> None:
    """In a forked worker, before any other hook runs: its heartbeat and stack dumpers."""
    if ctx is not None and isinstance(ctx.watch, Heartbeats):
        enter_worker(ctx.watch, ctx.worker_id)


def _clock_at_later_forks(ctx: ForkContext, plan: None) -> FastFork:
    """At a start's later forks the C path times each worker's start in the Watch's slots."""
    watch = ctx.watch
    return FastFork(clock=(watch.slots, FIELDS, LAST)) if isinstance(watch, Heartbeats) else FastFork()


def register() -> None:
    """Register the watchdog's fork hook (at import of safeloader)."""
    # First among after_in_child hooks (and last in `before`), so that a hang in
    # a later hook or in worker_init_fn is diagnosed with stacks too.
    # Spawn/forkserver workers start their watch in safeloader's worker_init_fn instead.
    _hooks.register_planned(
        before=_start_clock_at_fork,
        after_in_parent=None,
        after_in_child=_enter_worker_at_fork,
        name=hook_names.WATCHDOG,
        first=True,
        description="names a worker that makes no progress for stall_timeout seconds, then stops the workers",
        fast_fork=_clock_at_later_forks,
    )
