"""Open files: each forked worker reads the files its Dataset holds through its own file offset.

How it works and why: docs/internals.md, ``safeloader.backends.files``.
"""

from __future__ import annotations

import functools
import io
import mmap
import os
import weakref
from typing import Any, NamedTuple

from .. import _hooks, hook_names, native
from .._context import ForkContext, fork_context
from .._hooks import FastFork
from .._options import Options
from . import _descriptors, _held_files, _reopen
from ._backend import Backend

NAME = "files"
SharedFileWarning = _reopen.SharedFileWarning


def privatize_inherited_files(
    records: bytes | None = None, *, lock_states: Any = None, first: int = 0, paths: _reopen.Paths = ()
) -> None:
    """In a worker: give each read-only regular file of ``records`` (``native.file_records``'; by
    default those the parent recorded for this fork, else every descriptor open now) its own
    description; ``lock_states``, ``first``: the records are a loader's files, their locks read
    once among the start's workers; ``paths``: the paths the files were opened by, where known
    (see ``_reopen.privatize_files``)."""
    if not _reopen.available():
        return
    context = fork_context()
    worker = context.worker_id if context is not None else None
    records = _reopen.offsets_at_fork() if records is None else records
    _reopen.privatize_files(records, worker, lock_states=lock_states, first=first, paths=paths)


def reduce_file(f: Any) -> tuple[Any, ...]:
    """Pickle a read-only binary file object by path, position and identity."""
    if isinstance(f, io.TextIOWrapper):
        raise TypeError(
            f"safeloader cannot reopen the text-mode file {f.name!r} in a spawn/forkserver worker "
            "(its newline setting cannot be read back): open it in binary mode ('rb'), or use fork workers"
        )
    raw = f.raw if isinstance(f, io.BufferedReader) else f
    name = raw.name
    if f.closed:
        raise TypeError(f"cannot pickle the closed file {name!r} for a DataLoader worker")
    if not isinstance(name, (str, bytes)) or raw.mode != "rb":
        raise TypeError(
            "safeloader reopens only read-only files opened by path in spawn/forkserver workers, "
            f"got {f!r} (mode {raw.mode!r}): open it with open(path, 'rb')"
        )
    path = os.fsdecode(name)
    identity = _reopen.FileIdentity.of_fd(raw.fileno())
    return reopen_file, (path, isinstance(f, io.BufferedReader), f.tell(), identity)


def reopen_file(path: str, buffered: bool, position: int, identity: _reopen.FileIdentity) -> Any:
    """In a spawn/forkserver worker: the file object the parent pickled, reopened."""

    def opener() -> Any:
        f = open(path, "rb", buffering=-1 if buffered else 0)
        try:
            identity.check(path, _reopen.FileIdentity.of_fd(f.fileno()))
            f.seek(position)
        except BaseException:
            f.close()
            raise
        return f

    return _reopen.reopen_or_unavailable("file", path, opener)


class FilesBackend(Backend):
    name = NAME
    description = 'each worker reads the read-only files its Dataset holds (open(), npz, HDF5) at its own offset'
    # Before the plain backends' child hooks, which may read files through the descriptors it privatizes.
    first = True
    # h5py's NAME through hook_names, not backends.h5py: h5py imports this module (its hazards name
    # this hook), and importing it back would make an import cycle.
    runs_after = (hook_names.H5PY,)

    def __init__(self) -> None:
        # loader -> the files its objects held at its last start (or EVERY_FILE)
        self._held: weakref.WeakKeyDictionary[Any, _Held | str] = weakref.WeakKeyDictionary()

    def before(self, ctx: ForkContext) -> Any:
        held = self._held.get(ctx.loader, _held_files.EVERY_FILE) if ctx is not None else _held_files.EVERY_FILE
        if isinstance(held, _Held):
            # Each descriptor the loader's objects held at the start, with its offset now (one lseek
            # each). The worker checks what each one is (a regular file open read-only, unlocked).
            if not held.records:
                return self.NOTHING_TO_DO
            if held.reader is not None:  # stopped when the start's forks are done, not later
                ctx.hold_for_start(NAME, functools.partial(native.stop_lock_reader, held.reader))
                native.lock_reader_identified(held.reader)  # each record's identity, read before its offset
            records = native.file_offsets(held.records)
            _reopen.offsets_at_fork(records)  # the offsets _reopen.privatize reads (h5py's hook)
            # Each worker begins its reopening at its own share of the records: the locks it reads
            # there are the ones the others find already read.
            first = ctx.worker_id * len(held.lock_states) // max(ctx.num_workers, 1)
            return records, held.paths, held.lock_states, first
        # A file's access mode never changes: one the parent holds read-only now is read-only in the
        # worker. Without one, nothing to privatize (h5py's writable files are read by offset: pread).
        if not _descriptors.kinds_at_fork() & native.READ_ONLY_FILE:
            return self.NOTHING_TO_DO
        _reopen.offsets_at_fork()  # made in the parent for this fork's hooks, and inherited by the worker
        return None

    def after_in_child(self, ctx: ForkContext, plan: tuple[bytes, _reopen.Paths, Any, int] | None) -> None:
        if plan is None:  # every read-only file, recorded by the parent for this fork
            privatize_inherited_files()
        else:  # the descriptors the loader's objects held, their locks read once among the start's workers
            records, paths, lock_states, first = plan
            privatize_inherited_files(records, lock_states=lock_states, first=first, paths=paths)

    def fast_fork(self, ctx: ForkContext, plan: Any) -> FastFork:
        # Nothing to do at a later fork while no read-only file is open (the C path checks each fork).
        return FastFork(worker_plan=self.NOTHING_TO_DO, descriptor_kinds=native.READ_ONLY_FILE)

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        if start_method == "fork":
            # Once per start, before any fork: what the workers can reach. Without a read-only file
            # open there is nothing to find (the walk is skipped: a start with no file pays nothing).
            if not _hooks.hook_runs(NAME, options) or not _descriptors.AVAILABLE:
                self._held.pop(loader, None)
            elif not native.descriptor_kinds(native.READ_ONLY_FILE) & native.READ_ONLY_FILE:
                self._held[loader] = _Held(b"", (), _NO_STATES, None)
            else:
                names: dict[int, bytes] = {}
                held = _held_files.held_descriptors(loader, names)
                if isinstance(held, str):
                    self._held[loader] = held
                else:
                    self._held[loader] = _held_records(sorted(held), names)
        else:
            _reopen.register_reducer(io.FileIO, reduce_file)
            _reopen.register_reducer(io.BufferedReader, reduce_file)
            _reopen.register_reducer(io.TextIOWrapper, reduce_file)


class _Held(NamedTuple):
    """What a loader's objects held at its start: the records (``native.file_records``', sorted by
    fd) of their descriptors, the paths the file objects among them were opened by (by fd), the
    start's lock states, one byte a record, which its workers share, and the thread reading the
    identities and locks meanwhile (``native.read_locks_behind``), if any."""

    records: bytes | bytearray
    paths: _reopen.Paths
    lock_states: mmap.mmap | bytearray
    reader: Any


_NO_STATES = bytearray()
# From this many held files the parent reads their identities and locks on a thread of its own
# while it forks the workers (~3 us a file, on a core the start leaves idle): the first worker would
# read the locks before it could reopen its last file. Fewer cost less than starting a thread (~50 us).
_READ_BEHIND = 64


def _held_records(fds: list[int], names: dict[int, bytes]) -> _Held:
    """The start's ``_Held`` of the descriptors ``fds`` (sorted) the loader's objects hold. Each
    record's identity (st_dev, st_ino) is read before any offset (a worker finding its descriptor
    names another file since reads its own offset): here for a few, with each one's access mode, so
    that a worker with none to reopen runs nothing; for thousands, on a thread of the parent's while
    it goes on to fork (``native.read_locks_behind``: the first fork waits for them, about 0.6 us a
    file; then it reads their locks for the workers, on a core the start leaves idle). Each worker
    checks what each descriptor is (a regular file open read-only, unlocked) before reopening it."""
    reader = None
    if len(fds) >= _READ_BEHIND:
        states = _lock_states(len(fds))
        unidentified = bytearray(_reopen.unrecorded(fds))
        reader = native.read_locks_behind(unidentified, states)
        records: bytes | bytearray = unidentified
    if reader is None:
        records = native.file_records(tuple(fds), True)
        fds = [fd for fd, _, _, _ in _reopen.RECORD.iter_unpack(records)]
        states = _lock_states(len(fds))
    return _Held(records, tuple((fd, names[fd]) for fd in fds if fd in names), states, reader)


def _lock_states(count: int) -> mmap.mmap | bytearray:
    """A start's record of which held descriptions hold an exclusive flock/OFD lock (a lock, not a
    data handle: a worker re-locking a private copy would block on the parent's lock), one byte a
    record, 0 until read: memory the parent shares with the workers it forks next (an anonymous
    MAP_SHARED mapping, made before the forks). Each description's locks are read once (about 2-3 us
    a file from /proc/self/fdinfo) by the parent's lock reader or whichever worker comes to it
    first, instead of by the parent before it forks any. A lock taken or released in the parent
    while the workers start may be seen by some workers and not others, as one taken during a fork."""
    return mmap.mmap(-1, count) if count else _NO_STATES


BACKEND = FilesBackend()
