"""The open descriptors and the files behind them, in pure Python (csrc/descriptors.c and
csrc/private_files.c stand in for it with the extension)."""

from __future__ import annotations

import errno
import os
import stat
import struct
from typing import Any


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


def file_offsets(records: bytes | bytearray) -> bytes:
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


def read_locks_behind(records: bytearray, lock_states: Any) -> None:
    """No thread here (one of the gaps): the caller records the identities, the workers read every lock."""
    if len(records) % _RECORD.size:
        raise ValueError("records must be file_records' bytes")


def lock_reader_identified(reader: Any) -> None:
    """Nothing to wait for: ``read_locks_behind`` starts no thread."""


def stop_lock_reader(reader: Any) -> None:
    """Nothing to stop: ``read_locks_behind`` starts none."""


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
    lock_states: Any = None,
    first: int = 0,
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """(privatized, failed): give each descriptor of ``records`` (file_records') still open read-only
    on a regular file its own open file description, at the recorded offset, under the same number,
    reopened by its path in ``paths`` where that names the same file, else through /proc/self/fd;
    skipped: ``skip``, files on ``virtual_devices``, descriptions holding an exclusive lock (read
    with ``check_locks``, or through ``lock_states``: a byte a record, 0 not read yet, 1 free, 2
    held); without ``check_locks`` a number naming another file than its record. Going round from
    the record ``first``. ``failed``: (fd, errno) of those left shared."""
    import fcntl

    if len(records) % _RECORD.size:
        raise ValueError("records must be file_records' bytes")
    count = len(records) // _RECORD.size
    states = None if lock_states is None else memoryview(lock_states).cast("B")
    if states is not None and states.readonly:
        raise BufferError("lock_states must be writable")
    if states is not None and len(states) != count:
        raise ValueError(f"lock_states must hold one byte a record ({count}), got {len(states)}")
    if first < 0:
        raise ValueError(f"first must be >= 0, got {first}")
    skipped = set(skip)
    virtual = set(virtual_devices)
    known = dict(paths)
    privatized: list[int] = []
    failed: list[tuple[int, int]] = []
    unpacked = list(_RECORD.iter_unpack(records))
    for step in range(count):
        index = (first + step) % count
        fd, dev, ino, offset = unpacked[index]
        if fd in skipped:
            continue
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_dev in virtual:
                continue
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        except OSError:  # closed since
            continue
        same = (dev, ino) in ((found.st_dev, found.st_ino), (0, 0))  # 0, 0: not recorded
        if not _read_only(flags) or not (same or check_locks):
            continue  # without check_locks, a number naming another file than its record is not one vetted
        if check_locks or states is not None:
            state = states[index] if states is not None else 0
            if state == 0:
                state = 2 if _holds_exclusive_lock(fd) else 1
                if states is not None:
                    states[index] = state
            if state == 2:
                continue
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
