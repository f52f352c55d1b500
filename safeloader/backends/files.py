"""Open files: each forked worker reads through its own file offset.

Hook ``"files"``: in each worker, every descriptor the parent had open
read-only on a regular file is replaced by a fresh open file description of
the same file at the same offset (see ``_reopen``). That covers whatever holds
the descriptor: ``open()`` file objects (buffered or not, binary or text),
``np.load`` ``NpzFile`` archives, HDF5 files on any driver, raw ``os.open``
descriptors and C libraries' ``FILE*``. Skipped: descriptors open for writing,
non-regular files (pipes, sockets, devices), files under /proc, /sys and /dev,
and descriptions holding an exclusive flock/OFD lock (a lock, not data).

A descriptor that cannot be reopened in the worker (its file's permissions
changed since the parent opened it, a stale NFS handle, a vanished file...)
stays shared with the parent, exactly as under torch's DataLoader, and the
worker warns once per path with a ``SharedFileWarning`` (a ``RuntimeWarning``)
naming the path, the worker and the errno. The worker never fails for it:
most such descriptors are not the Dataset's (library logs, configs).

Why at the descriptor level rather than by rebuilding file objects: the object
(its buffer, its text decoder state, its position) is left exactly as it was,
so no reader anywhere can tell the difference except that the offset is no
longer shared; and nothing needs finding in the Dataset's object graph, so
handles in globals and closures are covered too, at about 10 µs per file.

Spawn/forkserver: read-only binary file objects (``open(path, "rb")``, with
or without buffering) pickle by path, position and file identity, and are
reopened in the worker. Text-mode files are refused with a clear message
(their newline setting cannot be read back, so a reopen could split lines
differently).
"""

from __future__ import annotations

import io
import os
from typing import Any

from .. import hook_names
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
    try:
        # The table the "sockets" hook listed for this fork, if it ran: one listing per worker.
        for entry in _reopen.regular_file_fds(_descriptors.inherited()):
            if not entry.read_only or entry.fd in done or _reopen.is_virtual(entry):
                continue
            if _reopen.holds_exclusive_lock(entry.fd):
                continue
            _reopen.privatize_or_share(entry, worker)  # never fails the worker: see its docstring
    finally:
        _descriptors.forget()  # the last hook of this fork to read it


def prepare_start(loader: Any, options: Options, start_method: str) -> None:
    if start_method != "fork":
        _reopen.register_reducer(io.FileIO, reduce_file)
        _reopen.register_reducer(io.BufferedReader, reduce_file)
        _reopen.register_reducer(io.TextIOWrapper, reduce_file)


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
    priority = 50  # before other backends' child hooks (priority 0), which may read files
    before = _reopen.record_at_fork
    after_in_parent = _reopen.forget_at_fork
    after_in_child = privatize_inherited_files
    prepare_start = staticmethod(prepare_start)

BACKEND = FilesBackend
