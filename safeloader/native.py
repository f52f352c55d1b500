"""The native core, or its pure-Python fallback (``SAFELOADER_DISABLE_NATIVE=1``), behind one interface;
``NATIVE`` says which one is in use."""

from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any


def _load() -> tuple[Any, bool]:
    """(the implementation, whether it is the C extension)."""
    if os.environ.get("SAFELOADER_DISABLE_NATIVE") != "1":
        try:
            return importlib.import_module("safeloader._native"), True
        except ImportError:
            pass
    return importlib.import_module("safeloader._native_fallback"), False


_impl, NATIVE = _load()

__all__ = [
    "NATIVE",
    "ThreadCensus",
    "descriptor_kinds",
    "descriptor_table",
    "exclusively_locked",
    "exit_handler_lock",
    "fast_fork_after_in_parent",
    "fast_fork_arm",
    "fast_fork_before",
    "fast_fork_disarm",
    "fast_fork_in_child",
    "fast_fork_python_fork",
    "file_offsets",
    "file_records",
    "foreign_thread_ids",
    "fork_generation",
    "free_signals",
    "install_backtrace_handler",
    "keep_errno",
    "loaded_counters",
    "loaded_objects",
    "lock_reader_identified",
    "privatize_files",
    "python_frames",
    "read_locks_behind",
    "read_proc",
    "regular_file_offsets",
    "release_backtrace_handler",
    "reserve_descriptor_slots",
    "signal_handler_address",
    "signal_thread",
    "stop_if_parked",
    "stop_lock_reader",
    "thread_census",
    "thread_ids",
    "thread_state",
    "threads_within",
    "warm_backtrace",
]


def read_proc(path: str, size: int = 4096) -> str:
    """The text of a small /proc file (up to ``size`` bytes), read with one system call and no
    file object: a thread's ``syscall`` or ``comm`` in 4 us where ``open()`` takes 15-30 (the io
    stack's three objects), once per native thread at a loader start. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, size).decode(errors="replace")
    finally:
        os.close(fd)


def fork_generation() -> int:
    """How many forks this process descends from since safeloader was imported."""
    return _impl.fork_generation()


def thread_ids() -> list[int]:
    """Sorted kernel thread ids (TIDs) of every OS thread of this process."""
    return _impl.thread_ids()


def threads_within(known: tuple[int, ...]) -> bool:
    """Whether every thread of this process now is in ``known``, a sorted tuple of ``thread_ids()``."""
    return _impl.threads_within(known)


def descriptor_table() -> tuple[tuple[int, int, int, int], ...]:
    """Every open descriptor of this process as ``(fd, st_mode, st_dev, st_ino)``."""
    return _impl.descriptor_table()


def regular_file_offsets() -> tuple[tuple[int, int, int, int], ...]:
    """``(fd, st_dev, st_ino, offset)`` of every descriptor open on a seekable regular file."""
    return _impl.regular_file_offsets()


def file_records(fds: tuple[int, ...] | None, read_only: bool) -> bytes:
    """``(fd, st_dev, st_ino, offset or -1)`` of the regular files among ``fds`` (None: every open
    descriptor; only those open read-only with ``read_only``), packed (struct ``"=qQQq"`` each)."""
    return _impl.file_records(fds, read_only)


def file_offsets(records: bytes | bytearray) -> bytes:
    """``records`` (``file_records``'), each with the offset its descriptor has now (-1: closed, or
    cannot seek): one lseek a file, the identities as recorded."""
    return _impl.file_offsets(records)


def privatize_files(
    records: bytes,
    skip: tuple[int, ...],
    virtual_devices: tuple[int, ...],
    check_locks: bool,
    paths: tuple[tuple[int, bytes], ...],
    lock_states: Any = None,
    first: int = 0,
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """In a worker: give each read-only regular file of ``records`` its own description at the
    recorded offset, under the same number; ``(privatized, (fd, errno) of those left shared)``;
    ``lock_states``: a writable byte a record, the locks read once among a start's workers,
    ``first``: the record to begin with (why and how: csrc/private_files.c)."""
    return _impl.privatize_files(records, skip, virtual_devices, check_locks, paths, lock_states, first)


def exclusively_locked(fds: tuple[int, ...]) -> tuple[int, ...]:
    """The descriptors of ``fds`` whose open file description holds an exclusive flock or OFD lock."""
    return _impl.exclusively_locked(fds)


def read_locks_behind(records: bytearray, lock_states: Any) -> Any:
    """Start a thread that writes the identity (st_dev, st_ino) of each descriptor of ``records``
    into its record, then reads their locks into ``lock_states`` (a writable byte a record, as
    ``privatize_files`` reads them); a handle for ``lock_reader_identified`` and
    ``stop_lock_reader`` (the thread is stopped when it goes), or None where none started."""
    return _impl.read_locks_behind(records, lock_states)


def lock_reader_identified(reader: Any) -> None:
    """Wait until ``read_locks_behind``'s thread has written every record's identity."""
    _impl.lock_reader_identified(reader)


def stop_lock_reader(reader: Any) -> None:
    """Stop ``read_locks_behind``'s thread (before its next file) and wait for it."""
    _impl.stop_lock_reader(reader)


READ_ONLY_FILE, REGULAR_FILE, TCP_SOCKET = 1, 2, 4  # descriptor_kinds' bits


def descriptor_kinds(until: int = 7) -> int:
    """The kinds of descriptor this process holds, a bitmask of ``READ_ONLY_FILE``, ``REGULAR_FILE``,
    ``TCP_SOCKET``; the listing stops once each kind of ``until`` is seen (others may then be missing)."""
    return _impl.descriptor_kinds(until)


def reserve_descriptor_slots(spare: int) -> int:
    """Grow this process's descriptor table to hold ``spare`` more descriptors (within ``RLIMIT_NOFILE``);
    returns the slots asked of the kernel (why: ``safeloader/_fd_table.py``)."""
    return _impl.reserve_descriptor_slots(spare)


def install_backtrace_handler(signum: int, fd: int) -> bool:
    """On ``signum``, the receiving thread writes its native backtrace to ``fd`` (signal-safe: works in a
    deadlocked thread); False without the C extension. Format: docs/internals.md, ``safeloader.native``."""
    return bool(_impl.install_backtrace_handler(signum, fd))


def release_backtrace_handler(signum: int) -> bool:
    """Put ``SIG_DFL`` back on ``signum`` if the backtrace handler is still the one there."""
    return bool(_impl.release_backtrace_handler(signum))


def warm_backtrace() -> None:
    """Load glibc's unwinder in this process, once, before forking workers (inherited done by each).

    Why, and why under the loader lock: docs/internals.md, ``safeloader.native``."""
    from . import _loader_lock

    _loader_lock.section(_impl.warm_backtrace)


def free_signals(count: int) -> list[int]:
    """Up to ``count`` real-time signals nobody holds in this process now (disposition ``SIG_DFL``,
    as ``sigaction`` sees it: handlers installed in C too), from ``SIGRTMAX`` down."""
    found: list[int] = _impl.free_signals(count)
    return found


def signal_handler_address(signum: int) -> int:
    """The current handler of ``signum`` as ``sigaction()`` gives it: 0 ``SIG_DFL``, 1 ``SIG_IGN``, else its address."""
    return int(_impl.signal_handler_address(signum))


def exit_handler_lock() -> tuple[int, bool]:
    """``(address, held_at_fork)`` of glibc's exit-handler lock (0: not found), and whether a thread of
    the parent held it when this process was forked."""
    address, held = _impl.exit_handler_lock()
    return int(address), bool(held)


def loaded_objects(full: bool, release_gil: bool) -> tuple[tuple[int, int] | None, tuple[str, ...] | None]:
    """``((loads, unloads) or None, names or None)``: the dynamic loader's counters and, with ``full``,
    the loaded objects in load order; ``release_gil``: whether other threads may run meanwhile."""
    return _impl.loaded_objects(full, release_gil)


def loaded_counters() -> tuple[int, int] | None:
    """The dynamic loader's (loads, unloads) counters, read in a ``_loader_lock.section``: a
    different value means a library was loaded or unloaded meanwhile. None where unreadable."""
    from . import _loader_lock

    return _loader_lock.section(_loaded_counters)[0]


def _loaded_counters(release: bool) -> tuple[tuple[int, int] | None, tuple[str, ...] | None]:
    return _impl.loaded_objects(False, release)  # a named function: no object made per call


# The C path of a loader start's later worker forks (csrc/fast_fork.c, safeloader/_fast_fork.py):
# the registry calls these bare at every fork, so they are the implementation's own functions.
# The fallback never arms it: every fork takes the registry's Python path.
fast_fork_arm = _impl.fast_fork_arm
"""``fast_fork_arm(thread_ids, counters, modules_state, globals, empty, kinds_mask, launch_code, target,
positions, num_workers, launches, clock, gc_state)``: arm the C path for this thread's later forks of a start
(``gc_state``: gc enabled between forks, and whether each fork pauses it)."""
fast_fork_disarm = _impl.fast_fork_disarm
"""``fast_fork_disarm()``: forget it (on the thread that armed it); how many forks took it."""
fast_fork_before = _impl.fast_fork_before
"""``fast_fork_before()``: in the registry's ``before``, whether this fork takes the C path."""
fast_fork_after_in_parent = _impl.fast_fork_after_in_parent
"""``fast_fork_after_in_parent()``: whether the fork now ending took the C path."""
fast_fork_in_child = _impl.fast_fork_in_child
"""``fast_fork_in_child()``: in a child, ``(worker_id, num_workers)`` if its fork took the C path, else None."""
fast_fork_python_fork = _impl.fast_fork_python_fork
"""``fast_fork_python_fork(open)``: the registry's Python path opens (True) or closes (False) a fork."""


def code_segments(release_gil: bool) -> tuple[tuple[int, int, str], ...]:
    """``((start, end, name), ...)``: each loaded object's executable segments, in load order,
    as the dynamic loader has them (name ``""`` for the main program; a library's name as it was
    found, not resolved). The walk holds the loader's lock, as ``loaded_objects``' does."""
    return _impl.code_segments(release_gil)


def parse_maps(data: bytes) -> tuple[list[int], list[int], list[int], list[int], list[str]]:
    """(all_starts, all_ends, starts, ends, names) from the bytes of /proc/self/maps: every
    mapping's bounds, then the bounds and path of each executable mapping of a file (in C, 0.3 ms
    for 1700 mappings; the Python loop took 2 ms)."""
    return _impl.parse_maps(data)


def signal_thread(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to one thread ``tid`` of process ``pid`` (tgkill)."""
    _impl.signal_thread(pid, tid, signum)


def stop_if_parked(functions: tuple[int, ...], interpreter: tuple[bytes, ...]) -> str | None:
    """Call the C functions ``int f(void)`` at the addresses ``functions`` only where every other
    Python thread is blocked in a system call with return addresses only into ``interpreter``'s code
    (exact paths; a path ending in "/": the files of that directory), the GIL held from the check to
    the calls' return (csrc/parked_threads.c). None where they were called, else why not."""
    return _impl.stop_if_parked(functions, interpreter)


def thread_state() -> int:
    """The address of the calling thread's ``PyThreadState`` (0 without the extension): a forked
    worker publishes its main thread's, where the parent reads its Python frames (``python_frames``)."""
    return int(_impl.thread_state())


def python_frames(pid: int, thread_state: int) -> list[tuple[str, str]] | None:
    """``[(file, function), ...]`` of the Python frames of the thread whose ``PyThreadState`` lies
    at ``thread_state`` in process ``pid``, a fork of this one, innermost first: read from outside
    (``process_vm_readv``), without a signal, while it runs. None where they cannot be read (the
    process ended, the kernel refuses, the frames' layout was not found, no extension).

    A running thread's frames change between two reads: the answer is a sample, each frame checked
    to be a code object's. The interpreter's own frames are left out: Python 3.12's C-stack entry
    frames (file ``<shim>``) and 3.13's frame under a class call with a Python ``__init__``
    (``_Py_InitCleanup``, file ``__init__``), which would pass for the program's innermost code.
    """
    if not _frames_probed():
        return None
    frames: list[tuple[str, str]] | None = _impl.python_frames(pid, thread_state)
    return None if frames is None else [frame for frame in frames if frame[0] not in _SHIM_FILES]


_SHIM_FILES = ("<shim>", "__init__")  # no module's file is named so: a path, or "<frozen ...>", "<string>"


def _frames_probed() -> bool:
    """Whether the interpreter frames' layout is known: found once, from ``_frames_probed_by``'s frame
    and its caller's (this function's), a plain Python call apart, whose code objects are known (the
    extension finds which words of a frame hold its code object and the link to its caller)."""
    return _frames_probed_by()


def _frames_probed_by() -> bool:
    return bool(_impl.probe_python_frames())


def keep_errno(signum: int) -> bool:
    """Wrap the handler installed on ``signum`` in C (faulthandler's) in one that restores errno.

    faulthandler's handler for a user signal leaves errno as its own writes set it (0), where the
    interrupted code may be between a call that set errno and the check of it: a library then
    takes its failed call for a success, or fails an assertion on errno (libzmq aborts). False
    where no handler is installed on ``signum``, and without the extension (nothing wrapped)."""
    return bool(_impl.keep_errno(signum))


@dataclass(frozen=True)
class ThreadCensus:
    """The OS threads of this process, split by who started them."""

    python: tuple[tuple[int, str], ...]
    """(tid, name) of threads started by Python's ``threading``."""
    foreign: tuple[tuple[int, str], ...]
    """(tid, kernel name) of threads Python did not start: native pools."""


def _kernel_thread_name(tid: int) -> str:
    # A census reads one name per native thread at every loader start (read_proc: 4 us, not 18).
    try:
        return read_proc(f"/proc/self/task/{tid}/comm", 64).strip()
    except OSError:  # the thread exited while we looked
        return "?"


def _python_threads() -> dict[int, str]:
    """tid -> name of each thread Python's ``threading`` started (the main thread included)."""
    main = threading.main_thread()
    python_threads = {t.native_id: t.name for t in threading.enumerate() if t.native_id and t is not main}
    if main.is_alive():
        # The main thread is the process's first, whose thread id is the pid. Its native_id is
        # wrong in a process that was itself forked (a multiprocessing or forkserver child, a
        # fork server's): CPython's threading keeps the forking parent's id for it.
        python_threads[os.getpid()] = main.name
    return python_threads


def foreign_thread_ids() -> tuple[int, ...]:
    """Sorted thread ids of the threads Python did not start (``thread_census().foreign``'s, without
    reading their names)."""
    python_threads = _python_threads()
    return tuple(tid for tid in thread_ids() if tid not in python_threads)


def thread_census() -> ThreadCensus:
    """Every OS thread of this process, and which ones Python did not start."""
    python_threads = _python_threads()
    python, foreign = [], []
    for tid in thread_ids():
        if tid in python_threads:
            python.append((tid, python_threads[tid]))
        else:
            foreign.append((tid, _kernel_thread_name(tid)))
    return ThreadCensus(python=tuple(python), foreign=tuple(foreign))
