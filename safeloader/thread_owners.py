"""Which shared object each native thread of this process waits for, read without stopping it.

A thread blocked in a system call shows its stack and instruction pointers in
``/proc/self/task/<tid>/syscall``. The instruction pointer is usually in libc
(a futex or poll wait); the return addresses just above the stack pointer name
the code that called it. They are read through ``/proc/self/mem`` (a stack
unmapped meanwhile reads as an error, never a crash) and looked up among the
executable mappings of the loaded objects (``/proc/self/maps``). No signal is
sent, no loader lock taken and no file opened but under /proc; an answer is
kept per thread.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right

__all__ = ["SYSTEM_LIBRARIES", "library_of", "owners"]

# Objects a pool's thread waits *through*, not the pool's owner.
SYSTEM_LIBRARIES = ("libc.so", "libc-", "libpthread", "ld-linux", "ld64.so", "libstdc++", "libgcc_s", "libm.so")
_STACK_BYTES = 16384  # the innermost frames: a wait is a few calls below its owner's code
_POINTER = struct.calcsize("P")


class _Segments:
    """Executable mappings of the loaded objects, sorted, from /proc/self/maps (no loader lock
    taken, so no fork from another thread can inherit it held): read again only after the
    dynamic loader loaded or unloaded something (its counters, read in C)."""

    def __init__(self) -> None:
        self._counters: tuple[int, int] | None = None
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.names: list[str] = []

    def refresh(self) -> None:
        from . import _loader_lock, native

        with _loader_lock.section() as release:
            counters, _ = native.loaded_objects(False, release)
        if counters is not None and counters == self._counters and self.starts:
            return
        found = []
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6 and "x" in fields[1] and fields[5].startswith("/"):
                    low, high = fields[0].split("-")
                    found.append((int(low, 16), int(high, 16), fields[5].rstrip("\n")))
        found.sort()
        self._counters = counters
        self.starts = [start for start, _, _ in found]
        self.ends = [end for _, end, _ in found]
        self.names = [name for _, _, name in found]

    def name_at(self, address: int) -> str | None:
        i = bisect_right(self.starts, address) - 1
        return self.names[i] if i >= 0 and address < self.ends[i] else None


_segments: _Segments | None = None
_owners: tuple[int, dict[tuple[int, str], str]] = (0, {})  # (pid, (tid, name) -> the object it waits for)


def _is_system(path: str) -> bool:
    base = os.path.basename(path)
    return not path or any(base.startswith(prefix) for prefix in SYSTEM_LIBRARIES)


def _stack_words(stack: int) -> bytes:
    """Up to ``_STACK_BYTES`` of this process's memory from ``stack`` up (less where the mapping
    ends); the descriptor is not kept (a forked worker would inherit it, naming its parent)."""
    fd = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            return os.pread(fd, _STACK_BYTES, stack)
        except OSError:  # the stack ends within the range
            return os.pread(fd, 4096 - stack % 4096, stack)
    finally:
        os.close(fd)


def library_of(tid: int) -> str | None:
    """The first non-system object (its real path) on thread ``tid``'s innermost stack
    frames while it is blocked in a system call; None if it runs, ended, or shows none."""
    global _segments
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) < 3 or fields[0] == "running":
        return None
    try:
        stack, pc = int(fields[-2], 16), int(fields[-1], 16)
    except ValueError:
        return None
    if _segments is None:
        _segments = _Segments()
    _segments.refresh()
    where = _segments.name_at(pc)
    if where is not None and not _is_system(where):
        return where
    try:
        data = _stack_words(stack)
    except OSError:  # the thread exited meanwhile
        return None
    for (word,) in struct.iter_unpack("P", data[: len(data) - len(data) % _POINTER]):
        name = _segments.name_at(word)
        if name is not None and not _is_system(name):
            return name
    return None


def owners(threads: tuple[tuple[int, str], ...]) -> dict[int, str | None]:
    """``library_of`` for each (tid, kernel name) of ``threads``, kept once found (a thread
    keeps its owner; one running now is asked again next time)."""
    global _owners
    if _owners[0] != os.getpid():  # a forked child: thread ids of another process
        _owners = (os.getpid(), {})
    known = _owners[1]
    found = {}
    for tid, name in threads:
        library = known.get((tid, name))
        if library is None:
            library = library_of(tid)
            if library is not None:
                known[(tid, name)] = library
        found[tid] = library
    return found
