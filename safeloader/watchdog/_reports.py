"""What the watchdog raises: a stall's ``WorkerStallError``, each stalled worker's stacks collected
and its report worded (``diagnostics.stall_report``, ``diagnostics.certain_causes``); one for a batch
a worker could not send; torch's own error for a dead worker, with what the parent held at the fork.

How it works and why: docs/internals.md, ``safeloader.watchdog``.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from ..errors import WorkerStallError
from ._heartbeat import COLLATING, FIELDS, NATIVE_READY, NATIVE_SIGNAL, PYTHON_READY, PYTHON_SIGNAL, STARTING

__all__ = ["collected", "dead_worker", "send_failure"]


def collected(
    watch: Any, pids: list[int], stalled: list[tuple[int, float, float, float, float, float]], certain: bool
) -> WorkerStallError:
    """The error for the ``stalled`` workers (``Watch.stalled`` or, ``certain``, ``Watch.orphaned``),
    of pids ``pids``, their stacks collected from ``watch``'s stack dumpers."""
    from ..diagnostics import certain_causes, stall_report  # only once a worker stalled

    reports = []
    for (worker_id, waited, limit, state, items, batch), pid in zip(stalled, pids):
        flags = watch.ready_flags(worker_id)
        spins_in = watch.spins_in(worker_id) if certain else None
        report = stall_report.collect(
            worker_id, pid, waited, limit, state == STARTING, items,
            python_path=watch.python_stack_path(worker_id, pid) if flags & PYTHON_READY else None,
            native_path=watch.native_stack_path(worker_id, pid) if flags & NATIVE_READY else None,
            watch=watch,
            python_signal=int(watch.slots[worker_id * FIELDS + PYTHON_SIGNAL]),
            native_signal=int(watch.slots[worker_id * FIELDS + NATIVE_SIGNAL]),
            waits_in=watch.waits_in(worker_id) if certain else None,
            explain=not spins_in,
        )
        report.certain = certain
        if certain:
            report.spinning = spins_in or ""
            report.cause = certain_causes.spinning(spins_in, _main_frames(report)) if spins_in else (
                certain_causes.overruled(report.cause))
        report.collating = int(batch) if state == COLLATING else 0
        report.batch = int(batch)
        reports.append(report)
    message = stall_report.message(reports, watch)
    error = WorkerStallError(message, worker_id=reports[0].worker_id, reports=tuple(reports))
    error.details = "\n\n".join(stall_report.details(report) for report in reports)
    return error


def _main_frames(report: Any) -> list[tuple[str, str]]:
    main = next((thread for thread in report.native_threads if thread.tid == report.pid), None)
    return main.frames if main is not None else []


def send_failure(failures: list[tuple[int, int]]) -> WorkerStallError:
    """The error for workers that could not send a batch: (worker_id, errno or -1) each."""
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
    return WorkerStallError(message, worker_id=worker_id)


def dead_worker(iterator: Any, error: RuntimeError) -> RuntimeError | None:
    """torch's "DataLoader worker ... exited unexpectedly / is killed by signal", with which library
    the parent held at the fork where the workers were forked anyway (``Watch.lacking``); None where
    it held none."""
    lacking = iterator._safeloader_watch.lacking
    if not lacking:
        return None
    from ..diagnostics import unsafe_fork

    return unsafe_fork.dead_worker_error(error, lacking)
