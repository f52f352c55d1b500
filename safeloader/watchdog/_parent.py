"""The watchdog's side in the parent: its ``Watch`` over the workers' heartbeats (which busy worker
is stalled, which is only stopped, which is certain never to progress), the iterator's wait for a
batch, checking the Watch between steps (``attach``), and the end of a stall: the stacks collected,
the workers shut down, ``WorkerStallError`` raised.

How it works and why: docs/internals.md, ``safeloader.watchdog``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _torch_internals
from .._options import Options
from ..errors import out_of_descriptors_hint
from . import _reports, _worker
from ._heartbeat import (
    BATCH,
    FIELDS,
    IDLE,
    ITEMS,
    LAST,
    NATIVE_READY,
    NATIVE_SIGNAL,
    PYTHON_STATE,
    SEND_ERRNO,
    STATE,
    Heartbeats,
)
from ._receiving import THREAD_NAME as RECEIVE_WATCH_THREAD
from ._receiving import ReceiveWatcher
from ._stopped import continued_since_asked, stop_state, warn_stopped
from ._stuck import ORPHAN_WAIT, StuckWorkers

__all__ = ["Watch", "attach", "start_watch"]


class Watch(Heartbeats):
    """The parent's watch over one iterator's workers: their heartbeats (``Heartbeats``, shared
    with the workers) and what the parent alone keeps of them.

    Created in the parent before the workers start; travels to the workers
    inside safeloader's ``worker_init_fn`` (pickled for spawn/forkserver, by
    fork otherwise), where its ``enter_worker``, ``watch_result_queue`` and
    ``worker_ready`` are the worker's side (``_worker``).
    """

    def __init__(
        self, num_workers: int, stall_timeout: float, start_method: str, disabled_hooks: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(num_workers, stall_timeout, start_method, disabled_hooks)
        self.next_check = 0.0  # parent only: when the next heartbeat check is due
        # Parent only: per worker, when it was last seen continued after a stop (0.0: never).
        self.resumed = [0.0] * num_workers
        # Parent only: per worker, whether its current stop was reported (WorkerStoppedWarning).
        self.stop_reported = [False] * num_workers
        me = threading.current_thread()
        # Threads alive in the parent when the workers fork: a lock one of
        # them holds at that moment stays held forever in every worker.
        # safeloader's own (another iterator's ReceiveWatcher) takes no lock a worker could need.
        self.parent_threads = tuple(
            t.name for t in threading.enumerate() if t is not me and t.name != RECEIVE_WATCH_THREAD
        )
        # Parent only: libraries whose live threads forked workers lack (on_unsafe_fork "warn" or
        # "ignore"), and per worker the wait in one of them first seen (syscall, CPU ticks, when).
        self.lacking: tuple[Any, ...] = ()  # the unsafe_fork.Hazards the workers were forked with anyway
        self.lacking_pools: frozenset[str] = frozenset()
        self.find_lacking_pools: Any = None  # () -> hazards now, for a second look (forked workers only)
        self.stuck = StuckWorkers()  # parent only: what orphaned saw of each busy worker
        # Parent only: when the next check has something new to look at (a busy worker reaching
        # ORPHAN_WAIT, a window of StuckWorkers ending): the wait between two checks ends then, where
        # that comes before poll_interval. A spin is then named ORPHAN_WAIT + ORPHAN_CONFIRM after its
        # item began, not up to two poll intervals later.
        self.due = float("inf")

    # -- in the worker (``_worker``) -------------------------------------------

    def enter_worker(self, worker_id: int) -> None:
        """In worker ``worker_id``: install the stack dumpers and the heartbeat. Idempotent."""
        _worker.enter_worker(self, worker_id)

    def watch_result_queue(self, worker_id: int, queue: Any) -> None:
        """In the worker: a batch its result queue fails to send is reported to the parent."""
        _worker.watch_result_queue(self, worker_id, queue)

    def worker_ready(self, worker_id: int) -> None:
        """In the worker: its start (hooks, ``worker_init_fn``) is done; it waits for work."""
        _worker.worker_ready(self, worker_id)

    # -- in the parent -------------------------------------------------------

    def send_failures(self) -> list[tuple[int, int]]:
        """In the parent: (worker_id, errno or -1) of workers whose results could not be sent."""
        return [
            (worker_id, int(self.slots[worker_id * FIELDS + SEND_ERRNO]))
            for worker_id in range(self.num_workers)
            if self.slots[worker_id * FIELDS + SEND_ERRNO]
        ]

    @property
    def poll_interval(self) -> float:
        return min(1.0, max(0.05, self.stall_timeout / 10))

    def resume_all(self, when: float) -> None:
        """In the parent: every worker's clock starts again at ``when`` (this process was not running)."""
        self.resumed = [max(resumed, when) for resumed in self.resumed]

    def stalled(
        self, alive: list[bool], pids: list[int | None] | None = None, awaited: frozenset[int] = frozenset()
    ) -> list[tuple[int, float, float, float, float, float]]:
        """(worker_id, seconds without progress, limit, state, items, batch) of each stalled worker.

        Time a worker spent stopped (Ctrl-Z, SIGSTOP) does not count: once it is
        continued its clock starts again from the moment that is seen, and a
        worker stopped now is not stalled. Both are asked of the kernel about
        the worker (``pids``), so no signal handler is needed. An idle worker is
        never stalled, but one stopped between two batches while the loader
        waits for its next (``awaited``) is reported stopped like a busy one.
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
            if not alive[worker_id] or (state == IDLE and worker_id not in awaited):
                continue
            batch = self.slots[base + BATCH]
            waited, limit = now - max(last, self.resumed[worker_id]), self._limit(worker_id, state)
            if waited > limit:
                stop = stop_state(pid) if pid is not None else ""
                if pid is not None and stop:
                    self.resumed[worker_id] = now  # stopped, not stuck: its clock starts again when it runs
                    if not self.stop_reported[worker_id]:  # once a stop: this process runs, the worker does not
                        self.stop_reported[worker_id] = True
                        warn_stopped(worker_id, pid, waited, stop)
                elif state != IDLE:  # an idle one not stopped is about to take its indices
                    found.append((worker_id, waited, limit, state, items, batch))
        return found

    def _limit(self, worker_id: int, state: float) -> float:
        """``limit`` for worker ``worker_id`` in ``state``; an idle one is given ``stall_timeout``
        to take the indices it was sent."""
        if state == IDLE:
            return self.stall_timeout
        base = worker_id * FIELDS
        return self.limit(state, self.slots[base + ITEMS], self.slots[base + BATCH])

    def quiet(self, awaited: frozenset[int] = frozenset()) -> bool:
        """Whether no busy worker (nor idle one the loader waits for, ``awaited``) has gone without
        progress long enough for ``stalled`` or ``orphaned`` to look at it (read from the heartbeats
        only: no system call). When quiet, ``due`` is when the first such worker will have."""
        now = time.monotonic()
        due = float("inf")
        for worker_id in range(self.num_workers):
            base = worker_id * FIELDS
            state = self.slots[base + STATE]
            if state == IDLE and worker_id not in awaited:
                continue
            since = max(self.slots[base + LAST], self.resumed[worker_id])
            look = since + min(ORPHAN_WAIT, self._limit(worker_id, state))
            if now >= look:
                return False
            due = min(due, look)
        self.due = due
        return True

    def orphaned(
        self, alive: list[bool], pids: list[int | None]
    ) -> list[tuple[int, float, float, float, float, float]]:
        """Busy workers certain never to progress, as ``stalled`` gives them, long before their limit:
        one waiting, idle, in a library whose threads it lacks, or spinning in one (``_stuck``)."""
        found: list[tuple[int, float, float, float, float, float]] = []
        self.due = float("inf")
        if self.start_method != "fork":
            return found  # a spawned or forkserver worker lacks no thread of this process's
        now = time.monotonic()
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
            # Once a worker is certain, the others are not sampled (a second sampling would only
            # delay the report, by a second or more on a loaded machine); an idle one is still named.
            sample = self._sampler(worker_id, pid) if not found else None
            if self.stuck.idle(worker_id, pid, self.lacking_pools, now) or self.stuck.spinning(
                worker_id, pid, self.lacking_pools, now, sample
            ):
                found.append((worker_id, waited, ORPHAN_WAIT, state, items, self.slots[base + BATCH]))
        self.due = self.stuck.next_due()
        return found

    def _sampler(self, worker_id: int, pid: int) -> Any:
        """Samples of worker ``worker_id``'s main thread (None without its native dumper, or where its
        Python frames cannot be read from outside)."""
        base = worker_id * FIELDS
        thread_state = int(self.slots[base + PYTHON_STATE])
        if not self.ready_flags(worker_id) & NATIVE_READY or not thread_state:
            return None
        from ..diagnostics import spin_samples

        return spin_samples.sampler(
            pid, self.native_stack_path(worker_id, pid), int(self.slots[base + NATIVE_SIGNAL]), thread_state
        )

    def waits_in(self, worker_id: int) -> str | None:
        """The library ``orphaned`` saw worker ``worker_id``'s main thread wait in, or None."""
        seen = self.stuck.waits.get(worker_id)
        return seen[3] if seen is not None else None

    def spins_in(self, worker_id: int) -> str | None:
        """The package ``orphaned`` found worker ``worker_id``'s main thread spinning in, or None."""
        return self.stuck.spins_in.get(worker_id)




def start_watch(loader: Any, options: Options, start_method: str) -> Watch | None:
    """A Watch for the workers ``loader`` is about to start, or None when the watchdog is off."""
    if options.stall_timeout is None or loader.num_workers <= 0:
        return None
    if start_method == "fork":
        # Done once here, inherited done by every forked worker instead of paid in each.
        _worker.prepare_forks()
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


_SHORTEST_STEP = 0.05  # seconds: the shortest poll interval, also the shortest wait for a check due


def _wait_watching(iterator: Any, torch_wait: Callable[[float], tuple[bool, Any]], timeout: float
                   ) -> tuple[bool, Any]:
    """torch's wait for one batch, in steps of the poll interval, checking the heartbeats between
    (and meanwhile from the iterator's ``ReceiveWatcher`` where a step is blocked receiving a batch)."""
    watch: Watch = iterator._safeloader_watch
    receiving: ReceiveWatcher = iterator._safeloader_receiving
    remaining = timeout
    while True:
        # Up to the poll interval, less where a check is due sooner (``Watch.due``).
        step = min(remaining, watch.poll_interval, max(_SHORTEST_STEP, watch.due - time.monotonic()))
        started = time.monotonic()
        receiving.entering(step)
        try:
            success, data = torch_wait(step)
        except BaseException:
            _raise_found(iterator, watch, receiving)  # the killing of a stalled worker ended the step
            raise
        finally:
            receiving.left()
        _raise_found(iterator, watch, receiving)
        ended = time.monotonic()
        if ended - started > step + max(1.0, step):
            # This process was not running (stopped, suspended): nor, likely, were its
            # workers, and a forkserver's workers cannot be asked (not our children).
            watch.resume_all(ended)
        if success:
            # Data from healthy workers must not hide a stuck one: check now and then anyway.
            if time.monotonic() >= watch.next_check:
                _check(iterator, watch, receiving)
            return success, data
        _check(iterator, watch, receiving)
        remaining -= step
        if remaining <= 0:
            return False, None


def _raise_found(iterator: Any, watch: Watch, receiving: ReceiveWatcher) -> None:
    """Raise the stall the ``ReceiveWatcher`` found while a step was blocked, once every worker is stopped."""
    error = receiving.error
    if error is not None:
        _shutdown_now(iterator, watch)
        raise error from None


_watched_classes: dict[type, type] = {}
_PACKAGE = __name__.rpartition(".")[0]


def attach(iterator: Any, watch: Watch) -> None:
    """Make ``iterator`` (torch's multiprocessing iterator) check ``watch`` while it waits."""
    cls = type(iterator)
    if not _torch_internals.has_workers_to_watch(iterator):
        return  # not an iterator with workers we know how to watch
    watched = _watched_classes.get(cls)
    if watched is None:
        # The class is the package's (safeloader.watchdog), where Watch and attach are public.
        watched = _torch_internals.waiting_with(cls, _wait_watching, _PACKAGE, _reports.dead_worker, _stop_receiving)
        _watched_classes[cls] = watched
    iterator._safeloader_watch = watch
    # Started after the workers forked (none of them has it), on the iterator (a Watch travels pickled).
    iterator._safeloader_receiving = ReceiveWatcher(
        iterator,
        watch.poll_interval,
        find_stall=lambda blocked: _find_stall(blocked, watch),
        kill_busy=lambda blocked: _kill_busy(blocked, watch, join=False),
        resume_all=watch.resume_all,
    )
    iterator.__class__ = watched


def _stop_receiving(iterator: Any) -> None:
    """After torch shut the iterator's workers down: its ``ReceiveWatcher`` ends."""
    receiving = getattr(iterator, "_safeloader_receiving", None)
    if receiving is not None:
        receiving.stop()


def _check(iterator: Any, watch: Watch, receiving: ReceiveWatcher) -> None:
    """Raise what the heartbeats show (``_find_stall``), or what the ``ReceiveWatcher`` found, every
    worker stopped first. One thread at a time looks (``receiving.lock``)."""
    with receiving.lock:
        error = receiving.error or _find_stall(iterator, watch)
    if error is not None:
        _shutdown_now(iterator, watch)
        raise error


def _find_stall(iterator: Any, watch: Watch) -> BaseException | None:
    """The error for the workers the heartbeats show stalled (or unable to send), their stacks
    collected; None where none is. A stopped one is named (``WorkerStoppedWarning``) instead."""
    watch.next_check = time.monotonic() + watch.poll_interval
    failures = watch.send_failures()
    if failures:
        return _reports.send_failure(failures)
    awaited = _torch_internals.workers_awaited(iterator)
    if watch.quiet(awaited):
        # Nothing to ask the kernel: each system call lets the GIL go, and with busy threads in
        # this process getting it back costs a switch interval (5 ms) per call.
        return None
    workers = _torch_internals.worker_processes(iterator)
    alive = [worker_id < len(workers) and workers[worker_id].is_alive() for worker_id in range(watch.num_workers)]
    pids = [workers[worker_id].pid if worker_id < len(workers) else None for worker_id in range(watch.num_workers)]
    stalled, certain = watch.stalled(alive, pids, awaited), False
    if not stalled:
        stalled, certain = watch.orphaned(alive, pids), True
    if not stalled:
        return None
    # The workers are shut down after the report whatever it finds: unregistered from torch's SIGCHLD
    # handler first, so that one dying while its stacks are dumped (a faulthandler dump can crash a
    # running thread) does not turn this report into torch's "worker killed by signal".
    _torch_internals.forget_worker_pids(iterator)
    return _reports.collected(watch, [workers[worker_id].pid for worker_id, *_ in stalled], stalled, certain)


def _shutdown_now(iterator: Any, watch: Watch) -> None:
    """Stop every worker: kill the ones that are busy (they may never return), then torch's shutdown."""
    try:
        _kill_busy(iterator, watch)
    finally:
        _torch_internals.shutdown_workers(iterator)


def _kill_busy(iterator: Any, watch: Watch, join: bool = True) -> None:
    """Kill the busy workers (they may never return) and, with ``join``, wait for their end.

    torch's SIGCHLD handler would turn the killed workers into its own
    "worker exited unexpectedly" error, so their pids are unregistered first. The
    ``ReceiveWatcher``'s thread kills without ``join``: reaping is left to the main
    thread (torch's own checks reap a dead worker there, and two threads must not).
    """
    _torch_internals.forget_worker_pids(iterator)
    for worker_id, process in enumerate(_torch_internals.worker_processes(iterator)):
        if worker_id >= watch.num_workers or watch.state(worker_id) == IDLE or process.pid is None:
            continue
        if join and not process.is_alive():
            continue
        with contextlib.suppress(ProcessLookupError):  # dead and reaped meanwhile
            os.kill(process.pid, signal.SIGKILL)
        if join:
            process.join(timeout=5)
