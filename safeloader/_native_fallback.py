"""Pure-Python stand-in for the ``safeloader._native`` C extension: same functions, same answers, two
gaps (docs/internals.md, ``safeloader._native_fallback``)."""

from __future__ import annotations

import errno
import os
import stat
import struct
from typing import Any

_fork_generation = 0  # module state: the process's own count, as the C extension's is
_counted_pid = os.getpid()  # the process _fork_generation was counted for


def _on_fork_child() -> None:
    """Count the fork that made this process, once, whoever asks first (why: docs/internals.md)."""
    global _fork_generation, _counted_pid
    pid = os.getpid()
    if pid != _counted_pid:
        _counted_pid = pid
        _fork_generation += 1


os.register_at_fork(after_in_child=_on_fork_child)  # counts forks that nothing reads the counter in


def fork_generation() -> int:
    """Number of forks this process descends from since safeloader was imported."""
    _on_fork_child()
    return _fork_generation


def thread_ids() -> list[int]:
    """Sorted kernel thread ids of every OS thread of this process."""
    return sorted(int(name) for name in os.listdir("/proc/self/task"))


def threads_within(known: tuple[int, ...]) -> bool:
    """Whether every thread of this process now is in ``known`` (thread ids, sorted)."""
    return set(thread_ids()) <= set(known)


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


def descriptor_kinds(until: int = 7) -> int:
    """A bitmask of the kinds of descriptor open: 1 a regular file open read-only, 2 a regular
    file, 4 an IPv4/IPv6 stream socket; the listing stops once each kind of ``until`` is seen."""
    import fcntl
    import socket

    kinds = 0
    until &= 7
    if not until:
        return 0
    for fd, mode, _, _ in descriptor_table():
        if kinds & until == until:
            break
        try:
            if stat.S_ISREG(mode):
                flags = fcntl.fcntl(fd, fcntl.F_GETFL)
                kinds |= 2
                if flags & os.O_ACCMODE == os.O_RDONLY and not flags & getattr(os, "O_PATH", 0):
                    kinds |= 1
            elif stat.S_ISSOCK(mode):
                probe = socket.socket(fileno=fd)
                try:
                    if probe.family in (socket.AF_INET, socket.AF_INET6) and probe.type == socket.SOCK_STREAM:
                        kinds |= 4
                finally:
                    probe.detach()
        except OSError:  # closed meanwhile
            continue
    return kinds


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


_RECORD = struct.Struct("=qQQq")  # file_records' record: fd, st_dev, st_ino, offset (-1: cannot seek)
# File status flags a fresh description keeps (the access mode is read-only).
KEPT_STATUS_FLAGS = (
    getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_DIRECT", 0)
    | getattr(os, "O_NOATIME", 0)
    | getattr(os, "O_LARGEFILE", 0)
    | getattr(os, "O_SYNC", 0)
    | getattr(os, "O_DSYNC", 0)
)
_FDINFO_READ = 65536


def _read_only(flags: int) -> bool:
    return flags & os.O_ACCMODE == os.O_RDONLY and not flags & getattr(os, "O_PATH", 0)


def file_records(fds: tuple[int, ...] | None, read_only: bool) -> bytes:
    """The records (struct "=qQQq" each) of the regular files among ``fds`` (None: every open
    descriptor) as (fd, st_dev, st_ino, offset or -1), only those open read-only with ``read_only``."""
    import fcntl

    if fds is not None and not isinstance(fds, tuple):
        raise TypeError(f"fds must be a tuple or None, got {type(fds).__name__}")
    records = []
    for fd in (entry[0] for entry in descriptor_table()) if fds is None else fds:
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or (read_only and not _read_only(fcntl.fcntl(fd, fcntl.F_GETFL))):
                continue
        except (OSError, OverflowError):  # closed, or no descriptor number
            continue
        try:
            offset = os.lseek(fd, 0, os.SEEK_CUR)
        except OSError:
            offset = -1
        records.append(_RECORD.pack(fd, found.st_dev, found.st_ino, offset))
    return b"".join(records)


def file_offsets(records: bytes) -> bytes:
    """``records`` (file_records'), each with the offset its descriptor has now (-1: closed, or cannot seek)."""
    if len(records) % _RECORD.size:
        raise ValueError("records must be file_records' bytes")
    found = []
    for fd, dev, ino, _ in _RECORD.iter_unpack(records):
        try:
            offset = os.lseek(fd, 0, os.SEEK_CUR)
        except (OSError, OverflowError):
            offset = -1
        found.append(_RECORD.pack(fd, dev, ino, offset))
    return b"".join(found)


def _holds_exclusive_lock(fd: int) -> bool:
    """Whether this descriptor's open file description holds a write flock or OFD lock, read from
    /proc/self/fdinfo/<fd> (never /proc/locks: see csrc/private_files.c). Unreadable: False."""
    try:
        info = os.open(f"/proc/self/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        text = chunk = os.read(info, _FDINFO_READ)
        while len(chunk) == _FDINFO_READ:  # a short read is the end: one read unless it holds many locks
            chunk = os.read(info, _FDINFO_READ)
            text += chunk
    except OSError:
        return False
    finally:
        os.close(info)
    for line in text.split(b"\n"):
        # b"lock:\t1: FLOCK  ADVISORY  WRITE <pid> <maj:min:inode> 0 EOF". POSIX (fcntl) locks belong
        # to the process, not to the description: a worker holds none of them, and is not skipped.
        fields = line.split()
        if len(fields) > 4 and fields[0] == b"lock:" and fields[2] in (b"FLOCK", b"OFDLCK") and b"WRITE" in fields:
            return True
    return False


def exclusively_locked(fds: tuple[int, ...]) -> tuple[int, ...]:
    """The descriptors of ``fds`` (a tuple) whose open file description holds an exclusive flock or
    OFD lock, read from /proc/self/fdinfo."""
    if not isinstance(fds, tuple):
        raise TypeError(f"fds must be a tuple, got {type(fds).__name__}")
    return tuple(fd for fd in fds if fd >= 0 and _holds_exclusive_lock(fd))


def unlocked_file_records(fds: tuple[int, ...]) -> bytes:
    """``file_records(fds, True)`` with offsets -1, less the descriptions ``exclusively_locked`` finds."""
    locked = set(exclusively_locked(fds))
    kept = file_records(tuple(fd for fd in fds if fd not in locked), True)
    return b"".join(_RECORD.pack(fd, dev, ino, -1) for fd, dev, ino, _ in _RECORD.iter_unpack(kept))


def _open_by_path(path: bytes, flags: int, found: os.stat_result) -> int:
    """A fresh read-only descriptor of the file ``found`` (an fstat) by ``path``, or -1 where the path
    names another file now. Opened non-blocking (a FIFO put in its place must not hang the worker)."""
    try:
        fresh = os.open(path, os.O_RDONLY | (flags & KEPT_STATUS_FLAGS) | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return -1
    try:
        now = os.fstat(fresh)
        if stat.S_ISREG(now.st_mode) and (now.st_dev, now.st_ino) == (found.st_dev, found.st_ino):
            if not flags & os.O_NONBLOCK:
                os.set_blocking(fresh, True)
            return fresh
    except OSError:
        pass
    os.close(fresh)
    return -1


def privatize_files(
    records: bytes,
    skip: tuple[int, ...],
    virtual_devices: tuple[int, ...],
    check_locks: bool,
    paths: tuple[tuple[int, bytes], ...],
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """(privatized, failed): give each descriptor of ``records`` (file_records') still open read-only
    on a regular file its own open file description, at the recorded offset, under the same number,
    reopened by its path in ``paths`` where that names the same file, else through /proc/self/fd;
    skipped: ``skip``, files on ``virtual_devices``, with ``check_locks`` descriptions holding an
    exclusive lock. ``failed``: (fd, errno) of those left shared."""
    import fcntl

    if len(records) % _RECORD.size:
        raise ValueError("records must be file_records' bytes")
    skipped = set(skip)
    virtual = set(virtual_devices)
    known = dict(paths)
    privatized: list[int] = []
    failed: list[tuple[int, int]] = []
    for fd, dev, ino, offset in _RECORD.iter_unpack(records):
        if fd in skipped:
            continue
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_dev in virtual:
                continue
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        except OSError:  # closed since
            continue
        same = (dev, ino) == (found.st_dev, found.st_ino)
        if not _read_only(flags) or (check_locks and _holds_exclusive_lock(fd)) or not (same or check_locks):
            continue  # without check_locks, a number naming another file than its record is not one vetted
        fresh = -1
        try:
            if not same or offset < 0:
                offset = os.lseek(fd, 0, os.SEEK_CUR)
            fresh = _open_by_path(known[fd], flags, found) if fd in known else -1
            if fresh < 0:
                fresh = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | (flags & KEPT_STATUS_FLAGS) | os.O_CLOEXEC)
            if offset:
                os.lseek(fresh, offset, os.SEEK_SET)
            os.dup2(fresh, fd, inheritable=os.get_inheritable(fd))
        except OSError as exc:
            failed.append((fd, exc.errno or errno.EIO))
        else:
            privatized.append(fd)
        finally:
            if fresh >= 0:
                os.close(fresh)
    return tuple(privatized), tuple(failed)


def install_backtrace_handler(signum: int, fd: int) -> bool:
    """No native backtraces without the extension: installs nothing, returns False.

    The stall watchdog then reports the worker's Python stacks only.
    """
    return False


def warm_backtrace(release_gil: bool) -> None:
    """Nothing to warm without the extension (no backtrace handler is installed)."""


def parse_maps(data: bytes) -> tuple[list[int], list[int], list[int], list[int], list[str]]:
    """(all_starts, all_ends, starts, ends, names) from the bytes of /proc/self/maps: every
    mapping's bounds, then the bounds and path of each executable mapping of a file."""
    all_starts: list[int] = []
    all_ends: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    names: list[str] = []
    # "low-high perms offset dev inode path": the kernel lists mappings by address, sorted.
    for line in os.fsdecode(data).splitlines():
        dash = line.find("-")
        space = line.find(" ", dash)
        if dash <= 0 or space < 0:
            continue
        low, high = int(line[:dash], 16), int(line[dash + 1 : space], 16)
        all_starts.append(low)
        all_ends.append(high)
        if line[space + 3 : space + 4] == "x":
            path = line.find("/", space)
            if path > 0:
                starts.append(low)
                ends.append(high)
                names.append(line[path:])
    return all_starts, all_ends, starts, ends, names


_PT_LOAD, _PF_X = 1, 1


def code_segments(release_gil: bool) -> tuple[tuple[int, int, str], ...]:
    """((start, end, name), ...): each loaded object's executable segments, through ctypes'
    dl_iterate_phdr (name "" for the main program), in load order."""
    import ctypes

    class Phdr(ctypes.Structure):  # Elf64_Phdr / Elf32_Phdr
        _fields_ = (
            (("p_type", ctypes.c_uint32), ("p_flags", ctypes.c_uint32), ("p_offset", ctypes.c_uint64),
             ("p_vaddr", ctypes.c_uint64), ("p_paddr", ctypes.c_uint64), ("p_filesz", ctypes.c_uint64),
             ("p_memsz", ctypes.c_uint64), ("p_align", ctypes.c_uint64))
            if ctypes.sizeof(ctypes.c_void_p) == 8 else
            (("p_type", ctypes.c_uint32), ("p_offset", ctypes.c_uint32), ("p_vaddr", ctypes.c_uint32),
             ("p_paddr", ctypes.c_uint32), ("p_filesz", ctypes.c_uint32), ("p_memsz", ctypes.c_uint32),
             ("p_flags", ctypes.c_uint32), ("p_align", ctypes.c_uint32))
        )

    class Info(ctypes.Structure):
        _fields_ = (
            ("dlpi_addr", ctypes.c_size_t),
            ("dlpi_name", ctypes.c_char_p),
            ("dlpi_phdr", ctypes.POINTER(Phdr)),
            ("dlpi_phnum", ctypes.c_uint16),
        )

    callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t, ctypes.c_void_p)
    iterate = (ctypes.PyDLL if not release_gil else ctypes.CDLL)(None).dl_iterate_phdr
    iterate.argtypes = (callback_type, ctypes.c_void_p)
    iterate.restype = ctypes.c_int
    found: list[tuple[int, int, str]] = []

    def visit(info: Any, size: int, data: Any) -> int:
        object_ = info.contents
        name = os.fsdecode(object_.dlpi_name or b"")
        for i in range(object_.dlpi_phnum):
            header = object_.dlpi_phdr[i]
            if header.p_type == _PT_LOAD and header.p_flags & _PF_X and header.p_memsz:
                start = object_.dlpi_addr + header.p_vaddr
                found.append((start, start + header.p_memsz, name))
        return 0

    iterate(callback_type(visit), None)
    return tuple(found)


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
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def reserve_descriptor_slots(spare: int) -> int:
    """Grow this process's descriptor table to hold ``spare`` descriptors above the lowest free
    number (capped by the ``RLIMIT_NOFILE`` soft limit): the slots asked of the kernel, or 0 where
    nothing was done."""
    import fcntl
    import resource

    for fd in range(1024):  # the first open descriptor: 0 in nearly every process
        try:
            lowest = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0)
        except OSError as exc:
            if exc.errno == errno.EBADF:
                continue
            return 0  # EMFILE: no room at all
        os.close(lowest)
        slots = lowest + max(spare, 0)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:
            slots = min(slots, soft)
        if slots <= lowest + 1:
            return 0  # nothing to grow
        try:
            os.close(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, slots - 1))
        except OSError:  # EINVAL or EMFILE: the table stays as it is
            return 0
        return slots
    return 0


def release_backtrace_handler(signum: int) -> bool:
    """Nothing was installed without the extension: nothing to release."""
    return False


def thread_state() -> int:
    """No thread state is published without the extension: 0."""
    return 0


def probe_python_frames() -> bool:
    """No frame is read from outside without the extension: False."""
    return False


def python_frames(pid: int, thread_state: int) -> list[tuple[str, str]] | None:
    """No frame is read from outside without the extension: None."""
    return None


def keep_errno(signum: int) -> bool:
    """Nothing can be wrapped without the extension: returns False (faulthandler's handler stays
    as it is, and the watchdog samples no running worker with it)."""
    return False


def free_signals(count: int) -> list[int]:
    """Up to ``count`` real-time signals nobody holds, from ``SIGRTMAX`` down: ``SIG_DFL`` for
    Python's signal module and for the kernel (its masks see handlers installed in C too)."""
    import _signal
    import signal

    found: list[int] = []
    for signum in range(signal.SIGRTMAX, signal.SIGRTMIN - 1, -1):
        if len(found) == count:
            break
        try:
            if _signal.getsignal(signum) == _signal.SIG_DFL and signal_handler_address(signum) == 0:
                found.append(signum)
        except (OSError, ValueError):
            continue
    return found


def exit_handler_lock() -> tuple[int, bool]:
    """``(0, False)``: without the C extension glibc's exit-handler lock is neither found nor
    released in a fork child (a worker waiting for it is named by the stall report)."""
    return 0, False


def signal_handler_address(signum: int) -> int:
    """0 for ``SIG_DFL``, 1 for ``SIG_IGN``, 2 for any handler (the kernel's caught and
    ignored masks in /proc/self/status: they see handlers installed in C too)."""
    caught = ignored = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                caught = int(line.split()[1], 16)
            elif line.startswith("SigIgn:"):
                ignored = int(line.split()[1], 16)
    bit = 1 << (signum - 1)
    return 2 if caught & bit else 1 if ignored & bit else 0


_linker: Any = None  # ctypes' types and the loader walk, made once per process


def loaded_objects(full: bool, release_gil: bool) -> tuple[tuple[int, int] | None, tuple[str, ...] | None]:
    """``((adds, subs) or None, names or None)``, through ctypes' dl_iterate_phdr (a Python callback)."""
    import ctypes

    global _linker
    if _linker is None:

        class PhdrInfo(ctypes.Structure):
            _fields_ = (  # the fields up to the load counters (glibc >= 2.4), in their C layout
                ("dlpi_addr", ctypes.c_void_p),
                ("dlpi_name", ctypes.c_char_p),
                ("dlpi_phdr", ctypes.c_void_p),
                ("dlpi_phnum", ctypes.c_uint16),
                ("dlpi_adds", ctypes.c_ulonglong),
                ("dlpi_subs", ctypes.c_ulonglong),
            )

        callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(PhdrInfo), ctypes.c_size_t, ctypes.c_void_p)
        # (GIL held, GIL released): a PyDLL function keeps the GIL around the call.
        iterate = (ctypes.PyDLL(None).dl_iterate_phdr, ctypes.CDLL(None).dl_iterate_phdr)
        for function in iterate:
            function.argtypes = (callback_type, ctypes.c_void_p)
            function.restype = ctypes.c_int
        _linker = (callback_type, iterate, PhdrInfo.dlpi_subs.offset + ctypes.sizeof(ctypes.c_ulonglong))
    callback_type, iterate, counters_size = _linker
    counters: list[tuple[int, int] | None] = []
    names: list[str] = []

    def visit(info: Any, size: int, data: Any) -> int:
        found = info.contents
        if not counters:
            counters.append((found.dlpi_adds, found.dlpi_subs) if size >= counters_size else None)
        if not full:
            return 1
        if found.dlpi_name:
            names.append(os.fsdecode(found.dlpi_name))
        return 0

    iterate[bool(release_gil)](callback_type(visit), None)
    return (counters[0] if counters else None), (tuple(names) if full else None)


# The C path of a start's later worker forks (csrc/fast_fork.c) needs the C extension: here it is
# never armed, and every fork takes the registry's Python path.


def fast_fork_arm(
    thread_ids: object, counters: object, modules_state: object, globals: object, empty: object, kinds_mask: object,
    launch_code: object, target: object, positions: object, num_workers: object, launches: object, clock: object,
    gc_state: object,
) -> bool:
    return False


def fast_fork_disarm() -> int:
    return 0


def fast_fork_before() -> bool:
    return False


def fast_fork_after_in_parent() -> bool:
    return False


def fast_fork_in_child() -> tuple[int, int] | None:
    return None


def fast_fork_python_fork(open: bool) -> None:
    return None
