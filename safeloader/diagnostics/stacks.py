"""Stacks of another process's (or this process's) threads, for the stall report and ``doctor``.

How it works and why: docs/internals.md, ``safeloader.diagnostics.stacks``."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .. import native

NATIVE_THREAD_WAIT = 0.5
"""Seconds one thread gets to write its native backtrace."""

# Libraries every thread has on its stack: they say nothing about who owns it.
SYSTEM_LIBRARIES = ("libc.so", "libc-", "libpthread", "ld-linux", "libpython", "libstdc++", "libgcc_s", "libm.so")

_THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.IGNORECASE)
_PY_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')

_STDLIB = os.path.dirname(os.__file__)  # sysconfig's "stdlib" path, without sysconfig's 0.7 s first use


def library_file(file: str) -> bool:
    """Whether ``file`` (a Python frame's) is the standard library's (frozen modules too) or an installed package's."""
    return file.startswith(("<frozen ", _STDLIB + os.sep)) or "-packages" + os.sep in file


NativeFrames = list[tuple[str, str]]
"""(library path, symbol) per frame, innermost first."""


@dataclass
class PythonThread:
    ident: int
    main: bool
    frames: list[tuple[str, int, str]]
    """(file, line, function), innermost first (faulthandler's order)."""


@dataclass
class NativeThread:
    tid: int
    name: str
    kernel_wait: str
    """What the kernel says the thread waits in (``/proc/<pid>/task/<tid>/wchan``), e.g. futex_wait_queue."""
    frames: NativeFrames = field(default_factory=list)


def read_proc(path: str) -> str:
    try:
        with open(path) as proc:
            return proc.read().strip()
    except OSError:
        return ""


def size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_from(path: str, offset: int) -> str:
    """What a worker's stack dump (``/proc/<pid>/fd/<n>``) holds after ``offset``; "" once the worker
    is gone (it may exit or be killed between two reads: CI saw pyzmq's spinning worker end while
    its stacks were sampled, and a FileNotFoundError reached the user instead of the report)."""
    try:
        with open(path, "rb") as dump:
            dump.seek(offset)
            return dump.read().decode("utf-8", "replace")
    except OSError:
        return ""


def wait_for_dump(path: str, offset: int, deadline: float, marker: str | None = None) -> str:
    """What was appended to ``path`` after ``offset``: until ``marker`` appears, or the size settles."""
    last_size, settled_since = offset, None
    while time.monotonic() < deadline:
        now_size = size(path)
        if now_size > offset:
            if marker is not None and marker in read_from(path, offset):
                break
            if marker is None:
                if now_size == last_size and settled_since is not None and time.monotonic() - settled_since > 0.15:
                    break
                if now_size != last_size:
                    settled_since = time.monotonic()
        last_size = now_size
        time.sleep(0.02)
    return read_from(path, offset) if size(path) > offset else ""


def thread_ids(pid: int) -> list[int]:
    try:
        return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def blocks_signal(pid: int, tid: int, signum: int) -> bool:
    for line in read_proc(f"/proc/{pid}/task/{tid}/status").splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def parse_python(text: str, main_ident: int | None) -> list[PythonThread]:
    threads: list[PythonThread] = []
    for line in text.splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            ident = int(header.group(2), 16)
            threads.append(PythonThread(ident, ident == main_ident, []))
            continue
        frame = _PY_FRAME.match(line)
        if frame and threads:
            threads[-1].frames.append((frame["file"], int(frame["line"]), frame["func"]))
    return threads


def parse_native(text: str) -> dict[int, NativeFrames]:
    frames: dict[int, NativeFrames] = {}
    current: NativeFrames | None = None
    for line in text.splitlines():
        parts = line.split(" ")
        if parts[0] == "native-thread" and len(parts) >= 2:
            current = frames.setdefault(int(parts[1]), [])
        elif parts[0] == "frame" and current is not None and len(parts) >= 5:
            symbol = " ".join(parts[4:])
            current.append((parts[2], f"?{parts[3]}" if symbol == "?" else symbol))  # unnamed: offset in the library
        elif parts[0] == "end-thread":
            current = None
    return frames


def python_stacks(pid: int, path: str, wait: float, signum: int) -> tuple[str, int | None]:
    """(faulthandler's text, the main thread's ident) of ``pid``, whose handler on ``signum`` writes to ``path``."""
    header = read_from(path, 0).splitlines()[:1]
    main_ident = int(header[0].split()[1], 16) if header and header[0].startswith("main-thread ") else None
    offset = size(path)
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return "", main_ident
    return wait_for_dump(path, offset, time.monotonic() + wait), main_ident


def native_stacks(pid: int, tids: Iterable[int], path: str, deadline: float, signum: int) -> dict[int, NativeFrames]:
    """Native frames of each thread of ``pid`` whose backtrace handler on ``signum`` writes to ``path``."""
    for tid in tids:
        if blocks_signal(pid, tid, signum):
            continue  # e.g. multiprocessing's resource-sharer thread blocks every signal
        offset = size(path)
        try:
            native.signal_thread(pid, tid, signum)
        except OSError:
            continue  # the thread exited meanwhile
        wait_for_dump(path, offset, min(deadline, time.monotonic() + NATIVE_THREAD_WAIT), marker=f"end-thread {tid}\n")
    return parse_native(read_from(path, 0))


def native_threads(pid: int, tids: Iterable[int], frames: dict[int, NativeFrames]) -> list[NativeThread]:
    return [
        NativeThread(
            tid,
            read_proc(f"/proc/{pid}/task/{tid}/comm"),
            read_proc(f"/proc/{pid}/task/{tid}/wchan"),
            frames.get(tid, []),
        )
        for tid in tids
    ]


def own_thread_libraries(tids: Iterable[int]) -> dict[int, list[str]]:
    """Non-system libraries on each of this process's native threads' stacks (innermost first), asked on a free
    real-time signal; empty without the extension or such a signal."""
    if not native.NATIVE:
        return {}
    import tempfile

    signals = native.free_signals(1)
    if not signals:
        return {}
    signum = signals[0]
    native.warm_backtrace()  # here, not with the GIL held in install_backtrace_handler
    with tempfile.TemporaryFile() as dump:
        native.install_backtrace_handler(signum, dump.fileno())
        try:
            frames = native_stacks(os.getpid(), tids, f"/proc/self/fd/{dump.fileno()}", time.monotonic() + 8.0, signum)
        finally:
            native.release_backtrace_handler(signum)  # a handler installed since stays
    return {
        tid: [lib for lib, _ in stack if not any(s in os.path.basename(lib) for s in SYSTEM_LIBRARIES)]
        for tid, stack in frames.items()
    }
