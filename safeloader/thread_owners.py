"""Which shared object each native thread of this process waits for, read without stopping it.

A thread blocked in a system call shows its stack and instruction pointers in
``/proc/self/task/<tid>/syscall``. The instruction pointer is usually in libc
(a futex or poll wait); the return addresses just above the stack pointer name
the code that called it. They are read through ``/proc/self/mem`` (a stack
unmapped meanwhile reads as an error, never a crash) and looked up among the
executable segments of the loaded objects (``dl_iterate_phdr``). No signal is
sent and no file is opened but under /proc; an answer is kept per thread.
"""

from __future__ import annotations

import ctypes
import os
from bisect import bisect_right

__all__ = ["SYSTEM_LIBRARIES", "library_of", "owners"]

# Objects a pool's thread waits *through*, not the pool's owner.
SYSTEM_LIBRARIES = ("libc.so", "libc-", "libpthread", "ld-linux", "ld64.so", "libstdc++", "libgcc_s", "libm.so")
_STACK_BYTES = 16384  # the innermost frames: a wait is a few calls below its owner's code
_PT_LOAD, _PF_X = 1, 1


class _Phdr(ctypes.Structure):  # Elf64_Phdr
    _fields_ = (
        ("p_type", ctypes.c_uint32),
        ("p_flags", ctypes.c_uint32),
        ("p_offset", ctypes.c_uint64),
        ("p_vaddr", ctypes.c_uint64),
        ("p_paddr", ctypes.c_uint64),
        ("p_filesz", ctypes.c_uint64),
        ("p_memsz", ctypes.c_uint64),
        ("p_align", ctypes.c_uint64),
    )


class _PhdrInfo(ctypes.Structure):
    _fields_ = (
        ("dlpi_addr", ctypes.c_uint64),
        ("dlpi_name", ctypes.c_char_p),
        ("dlpi_phdr", ctypes.POINTER(_Phdr)),
        ("dlpi_phnum", ctypes.c_uint16),
        ("dlpi_adds", ctypes.c_ulonglong),
        ("dlpi_subs", ctypes.c_ulonglong),
    )


_Callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_PhdrInfo), ctypes.c_size_t, ctypes.c_void_p)


class _Segments:
    """Executable segments of the loaded objects, sorted: listed again only after a load or unload."""

    def __init__(self) -> None:
        # Called with the GIL held throughout (PyDLL): the callback runs Python while glibc's
        # loader lock is held, so no other thread may fork meanwhile (its child would hang at
        # its first dlopen; os.fork needs the GIL), nor wait for this thread's lock holding
        # the GIL this callback needs.
        libc = ctypes.PyDLL(None)
        self._iterate = libc.dl_iterate_phdr
        self._iterate.argtypes = (_Callback, ctypes.c_void_p)
        self._iterate.restype = ctypes.c_int
        self._counters: tuple[int, int] | None = None
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.names: list[str] = []
        self._visit = _Callback(self._on_object)  # one libffi closure for the process
        self._found: list[tuple[int, int, str]] = []
        self._first_only = False

    def _on_object(self, info, size, data) -> int:
        entry = info.contents
        if self._first_only:
            self._counters = (entry.dlpi_adds, entry.dlpi_subs)
            return 1
        name = os.fsdecode(entry.dlpi_name) if entry.dlpi_name else ""
        for i in range(entry.dlpi_phnum):
            phdr = entry.dlpi_phdr[i]
            if phdr.p_type == _PT_LOAD and phdr.p_flags & _PF_X:
                start = entry.dlpi_addr + phdr.p_vaddr
                self._found.append((start, start + phdr.p_memsz, name))
        return 0

    def refresh(self) -> None:
        before = self._counters
        self._first_only = True
        self._iterate(self._visit, None)
        self._first_only = False
        if before is not None and before == self._counters:
            return
        self._found = []
        self._iterate(self._visit, None)
        self._found.sort()
        self.starts = [start for start, _, _ in self._found]
        self.ends = [end for _, end, _ in self._found]
        self.names = [name for _, _, name in self._found]

    def name_at(self, address: int) -> str | None:
        i = bisect_right(self.starts, address) - 1
        return self.names[i] if i >= 0 and address < self.ends[i] else None


_segments: _Segments | None = None
_memory: tuple[int, int] | None = None  # (pid, descriptor of /proc/self/mem): a forked child opens its own
_owners: dict[tuple[int, str], str] = {}  # (tid, name) -> the object it waits for


def _is_system(path: str) -> bool:
    base = os.path.basename(path)
    return not path or any(base.startswith(prefix) for prefix in SYSTEM_LIBRARIES)


def _memory_fd() -> int:
    global _memory, _owners
    if _memory is None or _memory[0] != os.getpid():
        _memory = (os.getpid(), os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC))
        _owners = {}  # thread ids of another process
    return _memory[1]


def library_of(tid: int) -> str | None:
    """The first non-system object (its path as loaded) on thread ``tid``'s innermost stack
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
        words = os.pread(_memory_fd(), _STACK_BYTES, stack)
    except OSError:  # the stack ended within the range, or the thread exited
        try:
            words = os.pread(_memory_fd(), 4096 - stack % 4096, stack)
        except OSError:
            return None
    for (word,) in _words(words):
        name = _segments.name_at(word)
        if name is not None and not _is_system(name):
            return name
    return None


def _words(data: bytes):
    import struct

    return struct.iter_unpack("<Q", data[: len(data) - len(data) % 8])


def owners(threads: tuple[tuple[int, str], ...]) -> dict[int, str | None]:
    """``library_of`` for each (tid, kernel name) of ``threads``, kept once found (a thread
    keeps its owner; one running now is asked again next time)."""
    _memory_fd()  # resets the answers in a forked child
    found = {}
    for tid, name in threads:
        key = (tid, name)
        library = _owners.get(key)
        if library is None:
            library = library_of(tid)
            if library is not None:
                _owners[key] = library
        found[tid] = library
    return found
