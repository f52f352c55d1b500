"""The stall watchdog: a DataLoader worker that makes no progress is named, diagnosed and stopped.

How it works and why: docs/internals.md, ``safeloader.watchdog``.
"""

from __future__ import annotations

import _signal  # signal.getsignal converts each answer to an enum (1-2 us a call, in every worker)
import _thread
import errno
import faulthandler
import mmap
import os
import resource  # here, not in each worker: an import there costs it 0.1 ms
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _hooks, _torch_internals, hook_names, native
from ._context import ForkContext
from ._hooks import FastFork
from ._options import Options
from ._stopped_workers import WorkerStoppedWarning, continued_since_asked, stop_state, warn_stopped
from ._stuck_workers import ORPHAN_CONFIRM, ORPHAN_IDLE_TICKS, ORPHAN_WAIT, StuckWorkers  # noqa: F401
from .errors import out_of_descriptors_hint

__all__ = ["FIRST_ITEM_FACTOR", "Watch", "WorkerStallError", "WorkerStoppedWarning"]

FIRST_ITEM_FACTOR = 2.0
"""The worker's start and first item may take this many times ``stall_timeout``."""
SLOW_START_ALLOWANCE = 60.0
"""Extra seconds for a spawn/forkserver worker to start (it re-imports torch and the program)."""
# One slot of FIELDS doubles per worker; a double store is atomic on the
# platforms torch supports, and the parent re-reads before acting.
FIELDS = 10
STATE, ITEMS, LAST, READY, BATCH, PYTHON_FD, NATIVE_FD, SEND_ERRNO, PYTHON_SIGNAL, NATIVE_SIGNAL = range(FIELDS)
STARTING, IDLE, BUSY, COLLATING = 0.0, 1.0, 2.0, 3.0
# SEND_ERRNO: the errno (or -1) with which the worker's result queue failed to send a
# batch. multiprocessing's feeder thread only prints that and drops the batch, so
# the parent would wait forever for it (e.g. out of file descriptors).
# BATCH: how many items the current call works on (a Dataset's __getitems__, or
# collate_fn): the call gets stall_timeout per item, as single items do.
PYTHON_READY, NATIVE_READY = 1, 2
# PYTHON_SIGNAL, NATIVE_SIGNAL: the signals the worker chose for its stack dumpers (0: none).


class WorkerStallError(RuntimeError):
    """A DataLoader worker made no progress for ``stall_timeout`` seconds.

    ``worker_id`` is the first stalled worker; ``reports`` holds a
    ``StallReport`` per stalled worker (Python and native stacks, likely cause).
    """

    def __init__(self, message: str, *, worker_id: int | None = None, reports: tuple[Any, ...] = ()) -> None:
        super().__init__(message)  # one positional argument, like every safeloader error
        self.worker_id = worker_id
        self.reports = reports
        self.details = ""
        """Every stack collected, all threads, Python and native."""


class Watch:
    """The heartbeats of one iterator's workers, shared between parent and workers.

    Created in the parent before the workers start; travels to the workers
    inside safeloader's ``worker_init_fn`` (pickled for spawn/forkserver, by
    fork otherwise).
    """

    def __init__(
        self, num_workers: int, stall_timeout: float, start_method: str, disabled_hooks: frozenset[str] = frozenset()
    ) -> None:
        self.num_workers = num_workers
        self.disabled_hooks = disabled_hooks
        self.stall_timeout = float(stall_timeout)
        self.first_limit = self.stall_timeout * FIRST_ITEM_FACTOR
        self.start_limit = self.first_limit + (0.0 if start_method == "fork" else SLOW_START_ALLOWANCE)
        self.start_method = start_method
        import ctypes  # here, not at import: importing safeloader must stay cheap

        if start_method == "fork":
            # Anonymous shared memory: no descriptor in the parent or the workers
            # (multiprocessing's RawArray keeps one open for its arena).
            self._memory = mmap.mmap(-1, ctypes.sizeof(ctypes.c_double) * FIELDS * num_workers)
            self.slots = (ctypes.c_double * (FIELDS * num_workers)).from_buffer(self._memory)
        else:  # spawn/forkserver workers receive it pickled
            import multiprocessing

            self.slots = multiprocessing.RawArray("d", FIELDS * num_workers)
        self.parent_pid = os.getpid()
        self.next_check = 0.0  # parent only: when the next heartbeat check is due
        # Parent only: per worker, when it was last seen continued after a stop (0.0: never).
        self.resumed = [0.0] * num_workers
        # Parent only: per worker, whether its current stop was reported (WorkerStoppedWarning).
        self.stop_reported = [False] * num_workers
        me = threading.current_thread()
        # Threads alive in the parent when the workers fork: a lock one of
        # them holds at that moment stays held forever in every worker.
        self.parent_threads = tuple(t.name for t in threading.enumerate() if t is not me)
        # Parent only: libraries whose live threads forked workers lack (on_unsafe_fork "warn" or
        # "ignore"), and per worker the wait in one of them first seen (syscall, CPU ticks, when).
        self.lacking: tuple[Any, ...] = ()  # the unsafe_fork.Hazards the workers were forked with anyway
        self.lacking_pools: frozenset[str] = frozenset()
        self.find_lacking_pools: Any = None  # () -> hazards now, for a second look (forked workers only)
        self.stuck = StuckWorkers()  # parent only: what orphaned saw of each busy worker
        now = time.monotonic()
        for worker_id in range(num_workers):
            self.slots[worker_id * FIELDS + LAST] = now

    # -- where a worker's stack dumps are ------------------------------------
    # Each worker writes them to anonymous memory files (memfd) of its own,
    # which the parent reads through /proc: nothing outlives the processes,
    # whatever signal ends them.

    def python_stack_path(self, worker_id: int, pid: int) -> str:
        return f"/proc/{pid}/fd/{int(self.slots[worker_id * FIELDS + PYTHON_FD])}"

    def native_stack_path(self, worker_id: int, pid: int) -> str:
        return f"/proc/{pid}/fd/{int(self.slots[worker_id * FIELDS + NATIVE_FD])}"

    # -- in the worker -------------------------------------------------------

    def enter_worker(self, worker_id: int) -> None:
        """In worker ``worker_id``: install the stack dumpers and the heartbeat. Idempotent."""
        global _worker_beat
        if _worker_beat is not None and _worker_beat.watch is self:
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
                python_handler = native.signal_handler_address(python_signal)
                self.slots[base + PYTHON_FD] = float(python_fd)
                self.slots[base + PYTHON_SIGNAL] = float(python_signal)
                ready = PYTHON_READY
            if len(signals) == 2 and native.NATIVE:
                native_fd = os.memfd_create("safeloader-native-stacks")
                self.slots[base + NATIVE_FD] = float(native_fd)
                if native.install_backtrace_handler(signals[1], native_fd):
                    native_signal = signals[1]
                    self.slots[base + NATIVE_SIGNAL] = float(native_signal)
                    ready |= NATIVE_READY
        except OSError:
            # Out of descriptors (EMFILE) or no memfd: the heartbeat still works,
            # a stall is still reported, without stacks. The worker's own data
            # path needs the descriptors more than diagnostics do.
            pass
        _worker_beat = _Beat(self, base, python_fd, native_fd)
        native_handler = native.signal_handler_address(native_signal) if native_signal else 0
        _worker_beat.signals = (python_signal, python_handler, native_signal, native_handler)
        if not _fetchers_instrumented:  # a forked worker inherits the parent's (start_watch)
            _instrument_fetchers()
        self.slots[base + READY] = float(ready)

    def watch_result_queue(self, worker_id: int, queue: Any) -> None:
        """In the worker: a batch its result queue fails to send is reported to the parent."""
        slots, base = self.slots, worker_id * FIELDS
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

    def send_failures(self) -> list[tuple[int, int]]:
        """In the parent: (worker_id, errno or -1) of workers whose results could not be sent."""
        return [
            (worker_id, int(self.slots[worker_id * FIELDS + SEND_ERRNO]))
            for worker_id in range(self.num_workers)
            if self.slots[worker_id * FIELDS + SEND_ERRNO]
        ]

    def worker_ready(self, worker_id: int) -> None:
        """In the worker: its start (hooks, ``worker_init_fn``) is done; it waits for work.

        A stack dumper whose signal got another handler meanwhile (the user's
        ``worker_init_fn`` installed one on it) is given up: the parent will not
        send that signal, and the user's handler keeps it.
        """
        base = worker_id * FIELDS
        beat = _worker_beat
        if beat is not None and beat.watch is self and beat.signals != (0, 0, 0, 0):
            python_signal, python_handler, native_signal, native_handler = beat.signals
            ready = int(self.slots[base + READY])
            if python_signal and not _still_held(python_signal, python_handler):
                ready &= ~PYTHON_READY
            if native_signal and not _still_held(native_signal, native_handler):
                ready &= ~NATIVE_READY
            self.slots[base + READY] = float(ready)
        self.slots[base + LAST] = time.monotonic()
        self.slots[base + STATE] = IDLE

    # -- in the parent -------------------------------------------------------

    @property
    def poll_interval(self) -> float:
        return min(1.0, max(0.05, self.stall_timeout / 10))

    def limit(self, state: float, items: float, batch: float = 1.0) -> float:
        if state == STARTING:
            return self.start_limit
        per_item = self.first_limit if items == 0 else self.stall_timeout
        return per_item * max(1.0, batch)

    def resume_all(self, when: float) -> None:
        """In the parent: every worker's clock starts again at ``when`` (this process was not running)."""
        self.resumed = [max(resumed, when) for resumed in self.resumed]

    def stalled(
        self, alive: list[bool], pids: list[int | None] | None = None
    ) -> list[tuple[int, float, float, float, float, float]]:
        """(worker_id, seconds without progress, limit, state, items, batch) of each stalled worker.

        Time a worker spent stopped (Ctrl-Z, SIGSTOP) does not count: once it is
        continued its clock starts again from the moment that is seen, and a
        worker stopped now is not stalled. Both are asked of the kernel about
        the worker (``pids``), so no signal handler is needed.
        """
        now = time.monotonic()
        found = []
        for worker_id in range(self.num_workers):
            base = worker_id * FIELDS
            pid = pids[worker_id] if pids is not None and worker_id < len(pids) else None
            if pid is not None and continued_since_asked(pid):
                self.resumed[worker_id] = now
                self.stop_reported[worker_id] = False
            state, items, last = self.slots[base + STATE], self.slots[base + ITEMS], self.slots[base + LAST]
            if state == IDLE or not alive[worker_id]:
                continue
            batch = self.slots[base + BATCH]
            waited, limit = now - max(last, self.resumed[worker_id]), self.limit(state, items, batch)
            if waited > limit:
                stop = stop_state(pid) if pid is not None else ""
                if pid is not None and stop:
                    self.resumed[worker_id] = now  # stopped, not stuck: its clock starts again when it runs
                    if not self.stop_reported[worker_id]:  # once a stop: this process runs, the worker does not
                        self.stop_reported[worker_id] = True
                        warn_stopped(worker_id, pid, waited, stop)
                    continue
                found.append((worker_id, waited, limit, state, items, batch))
        return found

    def quiet(self) -> bool:
        """Whether no busy worker has gone without progress long enough for ``stalled`` or
        ``orphaned`` to look at it (read from the heartbeats only: no system call)."""
        now = time.monotonic()
        for worker_id in range(self.num_workers):
            base = worker_id * FIELDS
            state = self.slots[base + STATE]
            if state == IDLE:
                continue
            waited = now - max(self.slots[base + LAST], self.resumed[worker_id])
            if waited >= min(ORPHAN_WAIT, self.limit(state, self.slots[base + ITEMS], self.slots[base + BATCH])):
                return False
        return True

    def orphaned(
        self, alive: list[bool], pids: list[int | None]
    ) -> list[tuple[int, float, float, float, float, float]]:
        """Busy workers certain never to progress, as ``stalled`` gives them, long before their limit:
        one waiting, idle, in a library whose threads it lacks, or spinning in one (``_stuck_workers``)."""
        now = time.monotonic()
        found: list[tuple[int, float, float, float, float, float]] = []
        for worker_id in range(self.num_workers):
            base = worker_id * FIELDS
            pid = pids[worker_id] if worker_id < len(pids) else None
            state, items, last = self.slots[base + STATE], self.slots[base + ITEMS], self.slots[base + LAST]
            waited = now - max(last, self.resumed[worker_id])
            if state == IDLE or not alive[worker_id] or pid is None or waited < ORPHAN_WAIT:
                self.stuck.forget(worker_id)
                continue
            if not self.lacking_pools and self.find_lacking_pools is not None:
                # None found at the start: a pool's threads still running then (a loaded machine
                # schedules them late) could not be attributed. Looked for again, once, now.
                self.lacking_pools = frozenset(hazard.library for hazard in self.find_lacking_pools())
                self.find_lacking_pools = None
            if self.stuck.idle(worker_id, pid, self.lacking_pools, now) or self.stuck.spinning(
                worker_id, pid, self.lacking_pools, now, self._sampler(worker_id, pid)
            ):
                found.append((worker_id, waited, ORPHAN_WAIT, state, items, self.slots[base + BATCH]))
        return found

    def _sampler(self, worker_id: int, pid: int) -> Any:
        """Samples of worker ``worker_id``'s main stacks (None without both its dumpers)."""
        if self.ready_flags(worker_id) & (NATIVE_READY | PYTHON_READY) != NATIVE_READY | PYTHON_READY:
            return None
        from .diagnostics import spin_samples

        base = worker_id * FIELDS
        return spin_samples.sampler(
            pid, self.native_stack_path(worker_id, pid), int(self.slots[base + NATIVE_SIGNAL]),
            self.python_stack_path(worker_id, pid), int(self.slots[base + PYTHON_SIGNAL]),
        )

    def waits_in(self, worker_id: int) -> str | None:
        """The library ``orphaned`` saw worker ``worker_id``'s main thread wait in, or None."""
        seen = self.stuck.waits.get(worker_id)
        return seen[3] if seen is not None else None

    def spins_in(self, worker_id: int) -> str | None:
        """The package ``orphaned`` found worker ``worker_id``'s main thread spinning in, or None."""
        return self.stuck.spins_in.get(worker_id)

    def ready_flags(self, worker_id: int) -> int:
        return int(self.slots[worker_id * FIELDS + READY])

    def state(self, worker_id: int) -> float:
        return self.slots[worker_id * FIELDS + STATE]


def _still_held(signum: int, handler: int) -> bool:
    """Whether the handler installed on ``signum`` (at ``handler``) is still the one there."""
    try:
        return native.signal_handler_address(signum) == handler and _signal.getsignal(signum) == _signal.SIG_DFL
    except (OSError, ValueError):
        return False


# -- the worker's heartbeat ----------------------------------------------------------


def _spare_descriptors() -> float:
    """How many more file descriptors this process may open (0 when it cannot even list them)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return float("inf")
    try:
        return float(soft - len(os.listdir("/proc/self/fd")))
    except OSError:
        return 0.0


# Set in the parent before forking workers (``start_watch``), inherited: the limit is
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


class _Beat:
    """Heartbeat writer of this worker process."""

    def __init__(self, watch: Watch, base: int, python_fd: int, native_fd: int) -> None:
        self.watch = watch
        self.slots = watch.slots
        self.base = base
        self.python_fd = python_fd  # open for the worker's life: faulthandler writes to it (-1: none)
        self.native_fd = native_fd
        # (python signal, its handler's address, native signal, its handler's address); 0: none.
        self.signals: tuple[int, int, int, int] = (0, 0, 0, 0)

    def busy(self, batch: int = 1) -> None:
        self.slots[self.base + LAST] = time.monotonic()  # time first: the parent never sees BUSY with a stale time
        self.slots[self.base + BATCH] = float(batch)
        self.slots[self.base + STATE] = BUSY

    def collating(self, batch: int) -> None:
        self.slots[self.base + LAST] = time.monotonic()
        self.slots[self.base + BATCH] = float(batch)
        self.slots[self.base + STATE] = COLLATING

    def item_done(self, count: int = 1) -> None:
        self.slots[self.base + ITEMS] += count
        self.slots[self.base + LAST] = time.monotonic()

    def idle(self) -> None:
        self.slots[self.base + LAST] = time.monotonic()
        self.slots[self.base + STATE] = IDLE


_worker_beat: _Beat | None = None


def in_watched_worker() -> bool:
    """Whether this process is a DataLoader worker with the stall watchdog's signal handlers installed."""
    return _worker_beat is not None


class _CountingMapDataset:
    """What the worker's map-style fetcher reads through: counts each item done."""

    def __init__(self, dataset: Any, beat: _Beat) -> None:
        self._dataset = dataset
        self._beat = beat
        getitems = getattr(dataset, "__getitems__", None)
        # torch's fetcher uses __getitems__ when it is truthy; keep that choice.
        self.__getitems__ = self._getitems if getitems else None
        self._original_getitems: Any = getitems

    def __getitem__(self, index: Any) -> Any:
        item = self._dataset[index]
        self._beat.item_done()
        return item

    def _getitems(self, indices: Any) -> Any:
        count = _count(indices)
        self._beat.busy(count)  # the call works on `count` items: a budget for each
        items = self._original_getitems(indices)
        self._beat.item_done(count)
        self._beat.busy()
        return items

    def __len__(self) -> int:
        return len(self._dataset)


def _count(batch: Any) -> int:
    try:
        return max(1, len(batch))
    except TypeError:  # no len(): one item's budget
        return 1


class _CountingIterator:
    """The Dataset's iterator, each item counted as done. Not a generator: an exception from the
    iterator must leave it usable for the next ``next()``, as under torch's fetcher (a generator
    ends at the first exception that passes through it, and the rest of the worker's items would be
    lost). Its other attributes are the iterator's (torchdata saves a Stateful one's state_dict)."""

    def __init__(self, iterator: Any, beat: _Beat) -> None:
        self._iterator = iterator
        self._beat = beat

    def __iter__(self) -> _CountingIterator:
        return self

    def __next__(self) -> Any:
        item = next(self._iterator)
        self._beat.item_done()
        return item

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_iterator", "_beat"):
            raise AttributeError(name)
        return getattr(self._iterator, name)


def _watch_fetcher(fetcher: Any, beat: _Beat) -> Any:
    fetch = fetcher.fetch

    def watched_fetch(index: Any) -> Any:
        beat.busy()
        try:
            return fetch(index)
        finally:
            beat.idle()

    fetcher.fetch = watched_fetch
    collate = getattr(fetcher, "collate_fn", None)
    if collate is not None:

        def watched_collate(batch: Any) -> Any:
            beat.collating(_count(batch))  # its own phase, with a budget per item collated
            return collate(batch)

        fetcher.collate_fn = watched_collate
    # Per-item progress, where the fetcher's structure is the one we know;
    # otherwise progress is counted per batch.
    if hasattr(fetcher, "dataset_iter"):
        fetcher.dataset_iter = _CountingIterator(fetcher.dataset_iter, beat)
    elif _torch_internals.is_map_fetcher(fetcher):
        fetcher.dataset = _CountingMapDataset(fetcher.dataset, beat)
    return fetcher


_fetchers_instrumented = False


def _instrument_fetchers() -> None:
    """In worker processes: every fetcher torch's worker loop creates is watched. Only a process
    with a heartbeat (a worker) watches its fetchers: elsewhere torch's fetcher is returned as
    is. So the parent installs it once, before forking (``start_watch``), and a forked worker
    finds it in place; a spawn/forkserver worker installs its own."""
    global _fetchers_instrumented
    if not _fetchers_instrumented:
        _fetchers_instrumented = _torch_internals.wrap_create_fetcher(_watch_if_in_worker)


def _watch_if_in_worker(fetcher: Any) -> Any:
    beat = _worker_beat
    return _watch_fetcher(fetcher, beat) if beat is not None else fetcher


def _start_clock_at_fork(ctx: ForkContext | None) -> None:
    """In the parent, last before a worker fork: its start is timed from now.

    The Watch was created before the first fork; another hook may have waited
    long since (for a lock another thread held), and that is not the worker's time.
    """
    if ctx is not None and isinstance(ctx.watch, Watch):
        ctx.watch.slots[ctx.worker_id * FIELDS + LAST] = time.monotonic()


def _enter_worker_at_fork(ctx: ForkContext | None, plan: None) -> None:
    """In a forked worker, before any other hook runs: its heartbeat and stack dumpers."""
    if ctx is not None and isinstance(ctx.watch, Watch):
        ctx.watch.enter_worker(ctx.worker_id)


def _clock_at_later_forks(ctx: ForkContext, plan: None) -> FastFork:
    """At a start's later forks the C path times each worker's start in the Watch's slots."""
    watch = ctx.watch
    return FastFork(clock=(watch.slots, FIELDS, LAST)) if isinstance(watch, Watch) else FastFork()


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


# -- the parent's side ---------------------------------------------------------------


def start_watch(loader: Any, options: Options, start_method: str) -> Watch | None:
    """A Watch for the workers ``loader`` is about to start, or None when the watchdog is off."""
    global _ample_descriptor_limit
    if options.stall_timeout is None or loader.num_workers <= 0:
        return None
    if start_method == "fork":
        # Done once here, inherited done by every forked worker instead of paid in each.
        _ample_descriptor_limit = _descriptor_limit()[1]
        native.warm_backtrace()
        _instrument_fetchers()
    try:
        return Watch(loader.num_workers, options.stall_timeout, start_method, options.disable_hooks)
    except OSError as error:  # its shared memory needs a descriptor: torch may still manage without
        import warnings

        warnings.warn(
            f"safeloader: the stall watchdog is off for this loader: {error}{out_of_descriptors_hint(error)}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _wait_watching(iterator: Any, torch_wait: Callable[[float], tuple[bool, Any]], timeout: float
                   ) -> tuple[bool, Any]:
    """torch's wait for one batch, in steps of the poll interval, checking the heartbeats between."""
    watch: Watch = iterator._safeloader_watch
    remaining = timeout
    while True:
        step = min(remaining, watch.poll_interval)
        started = time.monotonic()
        success, data = torch_wait(step)
        ended = time.monotonic()
        if ended - started > step + max(1.0, step):
            # This process was not running (stopped, suspended): nor, likely, were its
            # workers, and a forkserver's workers cannot be asked (not our children).
            watch.resume_all(ended)
        if success:
            # Data from healthy workers must not hide a stuck one: check now and then anyway.
            if time.monotonic() >= watch.next_check:
                _check(iterator, watch)
            return success, data
        _check(iterator, watch)
        remaining -= step
        if remaining <= 0:
            return False, None


def _explain_dead_worker(iterator: Any, error: RuntimeError) -> RuntimeError | None:
    """torch's "DataLoader worker ... exited unexpectedly / is killed by signal", with which library
    the parent held at the fork where the workers were forked anyway (``watch.lacking``)."""
    watch: Watch = iterator._safeloader_watch
    if not watch.lacking:
        return None
    from .diagnostics import unsafe_fork

    return unsafe_fork.dead_worker_error(error, watch.lacking)


_watched_classes: dict[type, type] = {}


def attach(iterator: Any, watch: Watch) -> None:
    """Make ``iterator`` (torch's multiprocessing iterator) check ``watch`` while it waits."""
    cls = type(iterator)
    if not _torch_internals.has_workers_to_watch(iterator):
        return  # not an iterator with workers we know how to watch
    watched = _watched_classes.get(cls)
    if watched is None:
        watched = _torch_internals.waiting_with(cls, _wait_watching, __name__, _explain_dead_worker)
        _watched_classes[cls] = watched
    iterator._safeloader_watch = watch
    iterator.__class__ = watched


def _check(iterator: Any, watch: Watch) -> None:
    watch.next_check = time.monotonic() + watch.poll_interval
    failures = watch.send_failures()
    if failures:
        _shutdown_now(iterator, watch)
        raise WorkerStallError(_send_failure_message(failures), worker_id=failures[0][0])
    if watch.quiet():
        # Nothing to ask the kernel: each system call lets the GIL go, and with busy threads in
        # this process getting it back costs a switch interval (5 ms) per call.
        return
    workers = _torch_internals.worker_processes(iterator)
    alive = [worker_id < len(workers) and workers[worker_id].is_alive() for worker_id in range(watch.num_workers)]
    pids = [workers[worker_id].pid if worker_id < len(workers) else None for worker_id in range(watch.num_workers)]
    stalled, certain = watch.stalled(alive, pids), False
    if not stalled:
        stalled, certain = watch.orphaned(alive, pids), True
    if not stalled:
        return
    from .diagnostics import certain_causes, stall_report  # only once a worker stalled

    reports = []
    for worker_id, waited, limit, state, items, batch in stalled:
        pid = workers[worker_id].pid
        flags = watch.ready_flags(worker_id)
        report = stall_report.collect(
            worker_id, pid, waited, limit, state == STARTING, items,
            python_path=watch.python_stack_path(worker_id, pid) if flags & PYTHON_READY else None,
            native_path=watch.native_stack_path(worker_id, pid) if flags & NATIVE_READY else None,
            watch=watch,
            python_signal=int(watch.slots[worker_id * FIELDS + PYTHON_SIGNAL]),
            native_signal=int(watch.slots[worker_id * FIELDS + NATIVE_SIGNAL]),
            waits_in=watch.waits_in(worker_id) if certain else None,
        )
        report.certain = certain
        if certain:
            spins_in = watch.spins_in(worker_id) or ""
            report.spinning = spins_in
            report.cause = certain_causes.spinning(spins_in, _main_frames(report)) if spins_in else (
                certain_causes.overruled(report.cause))
        report.collating = int(batch) if state == COLLATING else 0
        report.batch = int(batch)
        reports.append(report)
    _shutdown_now(iterator, watch)
    message = stall_report.message(reports, watch)
    error = WorkerStallError(message, worker_id=reports[0].worker_id, reports=tuple(reports))
    error.details = "\n\n".join(stall_report.details(report) for report in reports)
    raise error


def _main_frames(report: Any) -> list[tuple[str, str]]:
    main = next((thread for thread in report.native_threads if thread.tid == report.pid), None)
    return main.frames if main is not None else []


# A failed send counts as "out of descriptors" when fewer than this many are left.
DESCRIPTORS_LOW = 8


def _out_of_descriptors() -> bool:
    """Whether this process has (nearly) run out of file descriptors, the usual cause of a lost batch."""
    return _spare_descriptors() < DESCRIPTORS_LOW


def _send_failure_message(failures: list[tuple[int, int]]) -> str:
    worker_id, number = failures[0]
    what = os.strerror(number) if number > 0 else "an error"
    message = (
        f"safeloader: DataLoader worker {worker_id} could not send a batch to the main process ({what}); "
        "the batch is lost and the loader would wait for it forever. All workers were shut down."
    )
    if number in (errno.EMFILE, errno.ENFILE):
        message += (
            " The process ran out of file descriptors (tensors are sent between processes through them): "
            "raise the limit with `ulimit -n` in the shell, or call "
            "torch.multiprocessing.set_sharing_strategy('file_system') at the start of your program."
        )
    return message


def _shutdown_now(iterator: Any, watch: Watch) -> None:
    """Stop every worker: kill the ones that are busy (they may never return), then torch's shutdown.

    torch's SIGCHLD handler would turn the killed workers into its own
    "worker exited unexpectedly" error, so their pids are unregistered first.
    """
    try:
        _torch_internals.forget_worker_pids(iterator)
        for worker_id, process in enumerate(_torch_internals.worker_processes(iterator)):
            if worker_id < watch.num_workers and watch.state(worker_id) != IDLE and process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
                process.join(timeout=5)
    finally:
        _torch_internals.shutdown_workers(iterator)
