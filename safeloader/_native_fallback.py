"""Pure-Python stand-in for the ``safeloader._native`` C extension.

Same functions, same answers, with one documented gap: the fork counter is
driven by ``os.register_at_fork``, so it misses forks that bypass ``os.fork``
(a C library calling ``fork()`` directly). The C version counts those too.
"""

from __future__ import annotations

import os
import stat

_fork_generation = 0


def _on_fork_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_on_fork_child)


def fork_generation() -> int:
    """Number of forks this process descends from since safeloader was imported."""
    return _fork_generation


def thread_ids() -> list[int]:
    """Sorted kernel thread ids of every OS thread of this process."""
    return sorted(int(name) for name in os.listdir("/proc/self/task"))


def descriptor_table() -> tuple[tuple[int, int, int, int], ...]:
    """Every open descriptor of this process as (fd, st_mode, st_dev, st_ino), in listing order."""
    table = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:  # the listing's own descriptor, already closed
            continue
        table.append((fd, st.st_mode, st.st_dev, st.st_ino))
    return tuple(table)


def regular_file_offsets() -> tuple[tuple[int, int, int, int], ...]:
    """(fd, st_dev, st_ino, offset) of every descriptor open on a seekable regular file."""
    found = []
    for fd, mode, dev, ino in descriptor_table():
        if not stat.S_ISREG(mode):
            continue
        try:
            found.append((fd, dev, ino, os.lseek(fd, 0, os.SEEK_CUR)))
        except OSError:  # cannot seek, or closed meanwhile
            continue
    return tuple(found)


def install_backtrace_handler(signum: int, fd: int) -> bool:
    """No native backtraces without the extension: installs nothing, returns False.

    The stall watchdog then reports the worker's Python stacks only.
    """
    return False


def warm_backtrace() -> None:
    """Nothing to warm without the extension (no backtrace handler is installed)."""


def signal_thread(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to one thread of a process (tgkill), through libc when it has it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    tgkill = getattr(libc, "tgkill", None)
    if tgkill is None:  # glibc < 2.30: only the whole process can be signalled
        if tid != pid:
            raise OSError(f"signal_thread needs tgkill (glibc >= 2.30) for a thread other than the main one, got {tid}")
        os.kill(pid, signum)
        return
    if tgkill(pid, tid, signum) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


_last_continued = 0.0


def _on_continue(signum: int, frame: object) -> None:
    global _last_continued
    import time

    _last_continued = time.monotonic()


def install_continue_handler() -> bool:
    """Python's signal handlers can only be set from the main thread, and only
    where SIGCONT has no handler yet; otherwise stops are not detected."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGCONT) not in (signal.SIG_DFL, None):
        return signal.getsignal(signal.SIGCONT) is _on_continue
    signal.signal(signal.SIGCONT, _on_continue)
    return True


def last_continued() -> float:
    return _last_continued
