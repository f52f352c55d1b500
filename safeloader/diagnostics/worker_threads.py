"""What a forked worker's threads are doing, read from /proc without stopping or signalling it.

How it works and why: docs/internals.md, ``safeloader.diagnostics.worker_threads``.
"""

from __future__ import annotations

import os

from .. import native

__all__ = ["all_wait_in_futex", "cpu_ticks"]

# The futex system calls (futex, futex_waitv) by machine: a thread waiting on a mutex, a
# condition variable or a semaphore waits in one of them.
_FUTEX_CALLS = {"x86_64": ("202", "449"), "aarch64": ("98", "449")}


def cpu_ticks(pid: int) -> int | None:
    """The CPU time process ``pid`` used so far, all its threads, in clock ticks (utime + stime); None
    where it cannot be read (it ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def all_wait_in_futex(pid: int) -> bool:
    """Whether every thread of process ``pid`` is blocked in a futex wait: nothing in it waits for the
    outside (a read, a poll, a timer) that could wake the others. False where a thread runs, waits in
    any other system call, or cannot be read."""
    calls = _FUTEX_CALLS.get(os.uname().machine)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            line = native.read_proc(f"/proc/{pid}/task/{tid}/syscall")
        except OSError:
            return False
        number = line.split(" ", 1)[0]
        if calls is not None:
            if number not in calls:
                return False
        elif number in ("running", "-1") or "futex" not in _wchan(pid, tid):
            return False  # a machine whose numbers are not listed: the kernel's wait channel
    return bool(tids)


def _wchan(pid: int, tid: str) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/wchan") as wchan:
            return wchan.read()
    except OSError:
        return ""
