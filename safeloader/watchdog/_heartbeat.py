"""The heartbeats' shared memory: one slot of ``FIELDS`` doubles per worker, what each field
holds, and the limits a worker's progress is held to. Allocated in the parent (``Heartbeats``,
the base of its ``Watch``), written by each worker (``_worker``), read by the parent (``_parent``).

How it works and why: docs/internals.md, ``safeloader.watchdog``.
"""

from __future__ import annotations

import mmap
import os
import time

__all__ = [
    "BATCH",
    "BUSY",
    "COLLATING",
    "FIELDS",
    "FIRST_ITEM_FACTOR",
    "IDLE",
    "ITEMS",
    "LAST",
    "NATIVE_FD",
    "NATIVE_READY",
    "NATIVE_SIGNAL",
    "PYTHON_FD",
    "PYTHON_READY",
    "PYTHON_SIGNAL",
    "PYTHON_STATE",
    "READY",
    "SEND_ERRNO",
    "SLOW_START_ALLOWANCE",
    "STARTING",
    "STATE",
    "Heartbeats",
]

FIRST_ITEM_FACTOR = 2.0
"""The worker's start and first item may take this many times ``stall_timeout``."""
SLOW_START_ALLOWANCE = 60.0
"""Extra seconds for a spawn/forkserver worker to start (it re-imports torch and the program)."""
# One slot of FIELDS doubles per worker; a double store is atomic on the
# platforms torch supports, and the parent re-reads before acting.
FIELDS = 11
(STATE, ITEMS, LAST, READY, BATCH, PYTHON_FD, NATIVE_FD, SEND_ERRNO, PYTHON_SIGNAL, NATIVE_SIGNAL,
 PYTHON_STATE) = range(FIELDS)
STARTING, IDLE, BUSY, COLLATING = 0.0, 1.0, 2.0, 3.0
# SEND_ERRNO: the errno (or -1) with which the worker's result queue failed to send a
# batch. multiprocessing's feeder thread only prints that and drops the batch, so
# the parent would wait forever for it (e.g. out of file descriptors).
# BATCH: how many items the current call works on (a Dataset's __getitems__, or
# collate_fn): the call gets stall_timeout per item, as single items do.
PYTHON_READY, NATIVE_READY = 1, 2
# PYTHON_SIGNAL, NATIVE_SIGNAL: the signals the worker chose for its stack dumpers (0: none).
# PYTHON_STATE: the address of the worker's main thread's PyThreadState (0: unknown), where the
# parent reads its Python frames from outside (native.python_frames); an address fits a double.


class Heartbeats:
    """The heartbeats of one iterator's workers, shared between parent and workers.

    Created in the parent before the workers start (as its ``Watch``); travels to the workers
    inside safeloader's ``worker_init_fn`` (pickled for spawn/forkserver, by fork otherwise).
    Every worker's clock starts at its creation.
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
        now = time.monotonic()
        for worker_id in range(num_workers):
            self.slots[worker_id * FIELDS + LAST] = now

    def limit(self, state: float, items: float, batch: float = 1.0) -> float:
        """Seconds a worker in ``state``, ``items`` done, working on ``batch`` items, may go without progress."""
        if state == STARTING:
            return self.start_limit
        per_item = self.first_limit if items == 0 else self.stall_timeout
        return per_item * max(1.0, batch)

    # -- where a worker's stack dumps are ------------------------------------
    # Each worker writes them to anonymous memory files (memfd) of its own,
    # which the parent reads through /proc: nothing outlives the processes,
    # whatever signal ends them.

    def python_stack_path(self, worker_id: int, pid: int) -> str:
        return f"/proc/{pid}/fd/{int(self.slots[worker_id * FIELDS + PYTHON_FD])}"

    def native_stack_path(self, worker_id: int, pid: int) -> str:
        return f"/proc/{pid}/fd/{int(self.slots[worker_id * FIELDS + NATIVE_FD])}"

    # -- a worker's slot, read -----------------------------------------------

    def ready_flags(self, worker_id: int) -> int:
        return int(self.slots[worker_id * FIELDS + READY])

    def state(self, worker_id: int) -> float:
        return self.slots[worker_id * FIELDS + STATE]
