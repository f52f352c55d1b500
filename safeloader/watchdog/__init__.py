"""The stall watchdog: a DataLoader worker that makes no progress is named, diagnosed and stopped.

One job per module:

- ``_heartbeat``: the shared memory, one slot of doubles per worker: its layout and limits;
- ``_progress``: a worker's heartbeat, written around the fetcher torch's worker loop creates;
- ``_worker``: entering a worker (its stack dumpers, its result queue), the watchdog's fork hook;
- ``_parent``: the ``Watch``, the iterator's wait checking it, a stall's shutdown;
- ``_reports``: what the watchdog raises (a stall's report, its stacks collected);
- ``_stuck``: busy workers certain never to progress, named in seconds;
- ``_stopped``: a stopped worker told from a stalled one;
- ``_receiving``: the checks while the main thread is blocked receiving a batch.

``WorkerStallError`` and ``WorkerStoppedWarning`` live in ``safeloader.errors``.

How it works and why: docs/internals.md, ``safeloader.watchdog``.
"""

from __future__ import annotations

# The names the rest of safeloader, the tests and the benchmarks use.
from ..errors import WorkerStallError, WorkerStoppedWarning
from ._heartbeat import (  # noqa: F401
    BATCH,
    BUSY,
    COLLATING,
    FIELDS,
    FIRST_ITEM_FACTOR,
    IDLE,
    ITEMS,
    LAST,
    NATIVE_FD,
    NATIVE_READY,
    NATIVE_SIGNAL,
    PYTHON_FD,
    PYTHON_READY,
    PYTHON_SIGNAL,
    READY,
    SEND_ERRNO,
    SLOW_START_ALLOWANCE,
    STARTING,
    STATE,
    Heartbeats,
)
from ._parent import Watch, attach, start_watch  # noqa: F401
from ._progress import _Beat, in_watched_worker  # noqa: F401
from ._stuck import ORPHAN_CONFIRM, ORPHAN_IDLE_TICKS, ORPHAN_WAIT, StuckWorkers  # noqa: F401
from ._worker import DESCRIPTORS_LOW, register  # noqa: F401

__all__ = ["FIRST_ITEM_FACTOR", "Watch", "WorkerStallError", "WorkerStoppedWarning"]
