"""Open files: each forked worker reads through its own file offset.

How it works and why: docs/internals.md, ``safeloader.backends.files``.
"""

from __future__ import annotations

import io
import os
from typing import Any

from .. import hook_names, native
from .._options import Options
from .._registry import fork_context
from . import _descriptors, _reopen
from ._backend import Backend

NAME = hook_names.FILES
SharedFileWarning = _reopen.SharedFileWarning



def privatize_inherited_files() -> None:
    """In a worker: give every inherited read-only regular file its own description."""
    if not _reopen.available():
        return
    context = fork_context()
    worker = context.worker_id if context is not None else None
    done = _reopen.private_fds()
    # The table listed in the parent for this fork: one listing per worker.
    for entry in _reopen.regular_file_fds(_descriptors.at_fork()):
        if not entry.read_only or entry.fd in done or _reopen.is_virtual(entry):
            continue
        if _reopen.holds_exclusive_lock(entry.fd):
            continue
        _reopen.privatize_or_share(entry, worker)  # never fails the worker: see its docstring


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
    name = hook_names.FILES
    description = 'each worker reads inherited read-only files (open(), npz, HDF5) through its own file offset'
    # Before the plain backends' child hooks, which may read files through the descriptors it privatizes.
    first = True
    runs_after = (hook_names.H5PY,)

    def before(self) -> Any:
        # A file's access mode never changes: one the parent holds read-only now is read-only in the
        # worker. Without one, nothing to privatize (h5py's writable files are read by offset: pread).
        if not _descriptors.kinds_at_fork() & native.READ_ONLY_FILE:
            return self.NOTHING_TO_DO
        # Both made in the parent for this fork's hooks, and inherited by the worker.
        _descriptors.at_fork()
        _reopen.offsets_at_fork()
        return None

    def after_in_child(self, plan: None) -> None:
        privatize_inherited_files()

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        if start_method != "fork":
            _reopen.register_reducer(io.FileIO, reduce_file)
            _reopen.register_reducer(io.BufferedReader, reduce_file)
            _reopen.register_reducer(io.TextIOWrapper, reduce_file)


BACKEND = FilesBackend()
