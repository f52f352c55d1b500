"""Shared by the file-handle backends (files, h5py, npz): private file descriptions
in forked workers, and pickling by path for spawn/forkserver workers.

How it works and why: docs/internals.md, ``safeloader.backends._reopen``.
"""

from __future__ import annotations

import array
import os
import stat
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _context, native
from .._native_fallback import KEPT_STATUS_FLAGS  # one list of the status flags a fresh description keeps
from ..errors import SharedFileWarning
from . import _descriptors

_PROC_FD = _descriptors.PROC_FD
# Filesystems whose content the kernel generates: an offset there is not shared data.
_VIRTUAL_MOUNTS = ("/proc", "/sys", "/dev")
RECORD = struct.Struct("=qQQq")
"""``native.file_records``' record of a regular file: fd, st_dev, st_ino (both 0: not recorded),
offset (-1: cannot seek)."""
Paths = tuple[tuple[int, bytes], ...]
"""(fd, path) of the files whose path is known (a file object's ``name``), sorted by fd."""


@dataclass(frozen=True)
class InheritedFd:
    """A descriptor for a regular file, as found in this process."""

    fd: int
    flags: int
    dev: int
    ino: int

    @property
    def read_only(self) -> bool:
        return self.flags & os.O_ACCMODE == os.O_RDONLY and not self.flags & getattr(os, "O_PATH", 0)

    @property
    def path(self) -> str:
        try:
            return os.readlink(f"{_PROC_FD}/{self.fd}")
        except OSError:
            return f"<fd {self.fd}>"


def available() -> bool:
    """Whether descriptors can be listed and reopened (Linux /proc)."""
    return _descriptors.AVAILABLE


def regular_file_fds(table: Iterable[_descriptors.Descriptor] | None = None) -> Iterator[InheritedFd]:
    """Every descriptor of ``table`` (default: this process's, listed now) that refers to a regular file."""
    import fcntl

    for fd, mode, dev, ino in _descriptors.scan() if table is None else table:
        if not stat.S_ISREG(mode):
            continue
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            if table is not None:  # listed earlier (by the parent, before the fork): still that file?
                now = os.fstat(fd)
                if not stat.S_ISREG(now.st_mode):
                    continue
                dev, ino = now.st_dev, now.st_ino
        except OSError:  # closed meanwhile
            continue
        yield InheritedFd(fd, flags, dev, ino)


class _ThisProcess:
    """What this module keeps for the process. The device ids of /proc, /sys and /dev are found
    once per process, in the parent (``offsets_at_fork`` asks first), so that workers inherit the
    answer. The descriptors privatized and the paths warned about are this process's own: a forked
    child inherits the object and starts both sets afresh at its first use of them (``own``)."""

    __slots__ = ("pid", "private", "virtual_devices", "warned")

    def __init__(self) -> None:
        self.virtual_devices: frozenset[int] | None = None
        self.pid = -1  # whose ``private`` and ``warned`` they are
        self.private: set[int] = set()  # descriptors already privatized
        self.warned: set[str] = set()  # paths warned about (a worker warns once per path)

    def own(self) -> _ThisProcess:
        """This object, with ``private`` and ``warned`` made new if they were another process's."""
        pid = os.getpid()
        if self.pid != pid:
            self.pid, self.private, self.warned = pid, set(), set()
        return self


_process = _ThisProcess()


def _virtual_device_ids() -> frozenset[int]:
    """Device ids of /proc, /sys and /dev: found once per process (the parent's
    ``offsets_at_fork`` asks first, so that workers inherit the answer)."""
    if _process.virtual_devices is None:
        devices = set()
        for mount in _VIRTUAL_MOUNTS:
            try:
                devices.add(os.stat(mount).st_dev)
            except OSError:
                pass
        _process.virtual_devices = frozenset(devices)
    return _process.virtual_devices


def private_fds() -> set[int]:
    """Descriptors this process has privatized already (none right after a fork)."""
    return _process.private if _process.pid == os.getpid() else set()


def _where(worker_id: int | None) -> str:
    return f"DataLoader worker {worker_id}" if worker_id is not None else f"process {os.getpid()}"


def offsets_at_fork(recorded: bytes | None = None) -> bytes:
    """In the parent, before a worker fork: each regular file's offset (or those ``recorded`` by
    the caller), for the worker, as ``native.file_records`` records. Read in the worker instead, an
    offset can already have been moved by the parent, which runs on while the worker starts, and its
    buffered readers (gzip, tarfile, zipfile) would decode from the wrong place."""
    _virtual_device_ids()  # for the child's privatize_files, inherited
    # Files that cannot seek (or closed meanwhile) are recorded at -1: the child reads its own offset.
    return _context.fork_memo(_OFFSETS, _current_offsets if recorded is None else lambda: recorded)


_OFFSETS = "memo:offsets"


def _current_offsets() -> bytes:
    return native.file_records(None, False)


def unrecorded(fds: Sequence[int]) -> bytes:
    """Records of ``fds`` with no identity (0, 0) and no offset (-1): made without a system call
    (``native.file_offsets`` reads the offsets at each fork)."""
    fields = array.array("q", bytes(RECORD.size * len(fds)))
    fields[0::4] = array.array("q", fds)
    fields[3::4] = array.array("q", [-1]) * len(fds)
    return fields.tobytes()


def _offset_at_fork(entry: InheritedFd) -> int:
    # In a worker, the parent's record for this fork; none where it made none.
    recorded = _context.fork_memo(_OFFSETS, bytes)
    for fd, dev, ino, offset in RECORD.iter_unpack(recorded):
        if fd == entry.fd and (dev, ino) in ((entry.dev, entry.ino), (0, 0)) and offset >= 0:
            return offset
    return os.lseek(entry.fd, 0, os.SEEK_CUR)


def _open_fresh(entry: InheritedFd, read_only: bool) -> tuple[int, int]:
    """(a fresh descriptor of ``entry``'s file, the offset at the fork); raises OSError."""
    access = os.O_RDONLY if read_only else entry.flags & os.O_ACCMODE
    flags = access | (entry.flags & KEPT_STATUS_FLAGS) | os.O_CLOEXEC
    offset = _offset_at_fork(entry)
    return os.open(f"{_PROC_FD}/{entry.fd}", flags), offset


def _install_fresh(fd: int, fresh: int, offset: int) -> None:
    """Put ``fresh`` under the number ``fd``, at ``offset``."""
    private = _process.own().private
    try:
        if offset:
            os.lseek(fresh, offset, os.SEEK_SET)
        os.dup2(fresh, fd, inheritable=os.get_inheritable(fd))
    finally:
        os.close(fresh)
    private.add(fd)


def privatize(entry: InheritedFd, worker_id: int | None, *, read_only: bool = True) -> None:
    """Replace ``entry.fd`` in this (child) process with a fresh open file
    description of the same file, at the same offset, with the same flags.

    ``read_only=True`` opens the new description read-only whatever the old
    access mode: a worker can then read, but not write, a file the parent
    holds writable. Raises OSError naming the path and the worker (the h5py
    backend relies on it: a worker must not keep a writable descriptor of a
    file it was meant to be unable to write). See ``privatize_files``.
    """
    try:
        fresh, offset = _open_fresh(entry, read_only)
    except OSError as exc:
        raise type(exc)(
            exc.errno,
            f"safeloader could not give {_where(worker_id)} its own handle on {entry.path!r} "
            f"(descriptor {entry.fd}) inherited from the parent: {exc.strerror}. Open the file in the worker "
            f"instead (e.g. lazily on first use), or pass disable_hooks=('files',) to share the parent's handle",
        ) from exc
    _install_fresh(entry.fd, fresh, offset)


def privatize_files(
    records: bytes, worker_id: int | None, *, lock_states: Any = None, first: int = 0, paths: Paths = ()
) -> None:
    """Like ``privatize`` (read-only) for each descriptor of ``records`` (``native.file_records``',
    made by the parent) still open read-only on a regular file, except those already private, on
    /proc, /sys or /dev, or holding an exclusive flock/OFD lock (a lock, not a data handle: a worker
    re-locking a private copy would block on the parent's lock). ``lock_states``: the records are a
    loader's vetted files, and the start's workers share what they read of the locks through it
    (one byte a record in memory shared with them; ``first`` the record this worker begins with);
    without it the records are every read-only file at the fork, each one's locks read here. One
    call into ``native.privatize_files``: no Python object per file (a Dataset may hold thousands).
    A file whose path is in ``paths`` is reopened by it where that still names the same file
    (st_dev, st_ino): a third cheaper than through ``/proc/self/fd``.

    A file that cannot be reopened is left shared with the parent, as torch's DataLoader leaves
    it, with a warning once per path in this process (``SharedFileWarning``): the reopen can fail
    for reasons the program does not control (permissions changed since the parent opened the
    file, a stale NFS handle, a file that vanished, a device-backed path), and failing the worker
    would be worse than torch, which shares them all.
    """
    process = _process.own()
    privatized, failed = native.privatize_files(
        records, tuple(process.private), tuple(_virtual_device_ids()), lock_states is None, paths, lock_states, first
    )
    process.private.update(privatized)
    for fd, code in failed:
        path = InheritedFd(fd, 0, 0, 0).path
        if path in process.warned:
            continue
        process.warned.add(path)
        import warnings

        warnings.warn(
            f"safeloader: {_where(worker_id)} could not reopen {path!r} (descriptor {fd}) "
            f"for its own file offset: [Errno {code}] {os.strerror(code)}. Reads through this descriptor are "
            "shared with the parent and the other workers, as with torch's DataLoader; open the file in the "
            "worker (e.g. lazily on first use) if the Dataset reads it",
            SharedFileWarning,
            stacklevel=2,
        )


def worker_id() -> int | None:
    """The DataLoader worker id of this process, if it is one (fork or spawn)."""
    context = _context.fork_context()
    if context is not None:
        return context.worker_id
    import sys

    if "torch" in sys.modules:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None:
            return info.id
    return None


# -- pickling for spawn/forkserver ----------------------------------------------


def reducers_active() -> bool:
    """True while a safeloader loader starts its workers on this thread."""
    return _context.armed() is not None


_registered: set[type] = set()


def register_reducer(cls: type, reduce: Callable[[Any], tuple[Any, ...]]) -> None:
    """Pickle ``cls`` with ``reduce`` in multiprocessing's pickler while a
    safeloader loader starts workers; elsewhere ``cls`` pickles as before."""
    if cls in _registered:
        return
    from multiprocessing.reduction import ForkingPickler

    def scoped(obj: Any) -> tuple[Any, ...]:
        if reducers_active():
            return reduce(obj)
        return obj.__reduce_ex__(4)  # what pickle would have done without us

    ForkingPickler.register(cls, scoped)
    _registered.add(cls)


@dataclass(frozen=True)
class FileIdentity:
    """Which file a path named when the parent pickled a handle: a file
    replaced at the same path since must not be read in its place."""

    dev: int
    ino: int

    @classmethod
    def of_fd(cls, fd: int) -> FileIdentity:
        st = os.fstat(fd)
        return cls(st.st_dev, st.st_ino)

    @classmethod
    def of_path(cls, path: str) -> FileIdentity:
        st = os.stat(path)
        return cls(st.st_dev, st.st_ino)

    def check(self, path: str, found: FileIdentity) -> None:
        if found != self:
            raise FileNotFoundError(
                f"{path!r} is no longer the file the parent process opened (it was replaced or moved since)"
            )


class Unavailable:
    """Stands in, in a spawn/forkserver worker, for a handle that could not be
    reopened. Any use raises the reopen error, naming the path and the worker.

    Deferring the error to first use lets it reach the parent through torch's
    worker-error path; raised while unpickling, it would only kill the worker.
    """

    def __init__(self, what: str, path: str, error: BaseException) -> None:
        self._what = what
        self._path = path
        self._error = error

    def _raise(self, *args: Any, **kwargs: Any) -> Any:
        error = self._error
        kind = error.__class__ if isinstance(error, OSError) else OSError
        wid = worker_id()
        where = f"DataLoader worker {wid}" if wid is not None else f"process {os.getpid()}"
        raise kind(f"safeloader: {where} could not reopen {self._what} {self._path!r}: {error}")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocol probes (copy, numpy, pickle) see a plain object
            raise AttributeError(name)
        return self._raise()

    __getitem__ = __len__ = __iter__ = __contains__ = __bool__ = __enter__ = __call__ = _raise

    def __repr__(self) -> str:
        return f"<safeloader.Unavailable {self._what} {self._path!r}: {self._error}>"


def reopen_or_unavailable(what: str, path: str, opener: Callable[[], Any]) -> Any:
    """``opener()``, or an ``Unavailable`` placeholder if it raises OSError."""
    try:
        return opener()
    except OSError as exc:
        return Unavailable(what, path, exc)
