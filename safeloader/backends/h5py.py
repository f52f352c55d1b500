"""h5py: HDF5 files opened in the parent work in every DataLoader worker (why: docs/internals.md)."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from .. import _hooks
from .._context import ForkContext, fork_context
from .._options import Options
from ..diagnostics.native_libraries import Library
from ..errors import WritableFileWarning
from . import _reopen
from ._backend import Backend, Hazard
from .files import NAME as FILES
from .sockets import NAME as SOCKETS

NAME = "h5py"


Inodes = frozenset[tuple[int, int]]
"""(st_dev, st_ino) of files."""


def protect_writable_files(writable: Inodes) -> None:
    """In a worker: make its descriptors of the parent's ``writable`` HDF5 files read-only."""
    if not writable or not _reopen.available():
        return
    context = fork_context()
    worker = context.worker_id if context is not None else None
    for entry in _reopen.regular_file_fds():
        if (entry.dev, entry.ino) in writable and not entry.read_only:
            _reopen.privatize(entry, worker, read_only=True)


def _writable_files(warn: bool, warned: set[str]) -> set[tuple[int, int]]:
    """Inodes of the HDF5 files open for writing in this process (warning once for each)."""
    import h5py
    from h5py import h5f, h5fd

    found = set()
    with h5py._objects.phil:
        for fid in h5f.get_obj_ids(types=h5f.OBJ_FILE):
            if not fid.get_intent() & (h5f.ACC_RDWR | getattr(h5f, "ACC_SWMR_WRITE", 0)):
                continue
            fapl = fid.get_access_plist()
            driver = fapl.get_driver()
            if driver == h5fd.CORE and not fapl.get_fapl_core()[1]:
                continue  # in memory only: the worker's copy is private
            name = os.fsdecode(h5f.get_name(fid))
            identity = None
            try:
                identity = os.fstat(fid.get_vfd_handle()) if driver == h5fd.SEC2 else os.stat(name)
                found.add((identity.st_dev, identity.st_ino))
            except (OSError, ValueError, TypeError):
                pass  # a file object, or a file moved since: nothing we can match in workers
            if warn and name not in warned:
                warned.add(name)
                protected = (
                    "workers can read it as of the fork, but cannot write to it"
                    if identity is not None
                    else "safeloader cannot protect it, and a worker writing to it or closing it would corrupt it"
                )
                warnings.warn(
                    f"HDF5 file {name!r} is open for writing in the DataLoader's parent process; workers "
                    f"inherit it and safeloader does not reopen it ({protected}). If the Dataset reads it, "
                    "open it read-only with h5py.File(path, 'r') and close the writable handle before "
                    "iterating; write to it from the main process only.",
                    WritableFileWarning,
                    stacklevel=2,
                )
    return found


# -- spawn/forkserver: pickle by path and name -------------------------------------


def _locking_argument(fapl: Any) -> Any:
    try:
        use, ignore_when_disabled = fapl.get_file_locking()
    except (AttributeError, RuntimeError):
        return None
    if not use:
        return False
    return "best-effort" if ignore_when_disabled else True


def reduce_file(f: Any) -> tuple[Any, ...]:
    """Pickle an open read-only ``h5py.File`` by path and open parameters."""
    if not f.id.valid:
        raise TypeError(f"cannot pickle a closed h5py.File for a DataLoader worker, got {f!r}")
    name = f.filename
    driver = f.driver
    fapl = f.id.get_access_plist()
    options: dict[str, Any] = {}
    if driver == "core":
        block_size, backing_store = fapl.get_fapl_core()
        if not backing_store or not os.path.exists(name):
            raise TypeError(
                f"the in-memory HDF5 file {name!r} cannot be reopened in a spawn/forkserver worker (it has no "
                "file to reopen): write it to disk and open it with h5py.File(path, 'r'), or use fork workers"
            )
        options.update(block_size=block_size, backing_store=backing_store)
    elif driver not in ("sec2", "stdio", "direct"):
        raise TypeError(
            f"HDF5 file {name!r} is open on the {driver!r} driver, which safeloader cannot reopen in a "
            "spawn/forkserver worker (files on Python file objects have no path to reopen): "
            "open it by path, h5py.File(path, 'r'), or use fork workers"
        )
    if f.mode != "r":
        raise TypeError(
            f"HDF5 file {name!r} is open for writing (mode {f.mode!r}): safeloader reopens only read-only "
            "files in spawn/forkserver workers. Open it with h5py.File(path, 'r') in the Dataset"
        )
    identity = _file_identity(f, driver)
    _, rdcc_nslots, rdcc_nbytes, rdcc_w0 = fapl.get_cache()
    options.update(
        driver=None if driver == "sec2" else driver,
        libver=f.libver,
        swmr=bool(f.swmr_mode),
        rdcc_nslots=rdcc_nslots,
        rdcc_nbytes=rdcc_nbytes,
        rdcc_w0=rdcc_w0,
    )
    locking = _locking_argument(fapl)
    if locking is not None:
        options["locking"] = locking
    page_buf_size = fapl.get_page_buffer_size()[0]
    if page_buf_size:
        options["page_buf_size"] = page_buf_size
    return reopen_file, (name, tuple(sorted(options.items())), identity)


def _file_identity(f: Any, driver: str) -> _reopen.FileIdentity | None:
    """The open file's identity; None if unknown (a file moved since: the worker's reopen fails)."""
    try:
        if driver in ("sec2", "direct"):
            return _reopen.FileIdentity.of_fd(f.id.get_vfd_handle())
        return _reopen.FileIdentity.of_path(f.filename)
    except (OSError, ValueError, TypeError):
        return None


def reopen_file(name: str, options: tuple[tuple[str, Any], ...], identity: _reopen.FileIdentity | None) -> Any:
    """In a spawn/forkserver worker: the ``h5py.File`` the parent pickled, opened read-only."""
    key = (name, options, identity)
    reopened = BACKEND._reopened
    if key in reopened:
        return reopened[key]

    def opener() -> Any:
        import h5py

        found = _reopen.FileIdentity.of_path(name)  # FileNotFoundError if deleted or moved
        if identity is not None:
            identity.check(name, found)
        return h5py.File(name, "r", **dict(options))

    reopened[key] = handle = _reopen.reopen_or_unavailable("HDF5 file", name, opener)
    return handle


def reduce_object(obj: Any) -> tuple[Any, ...]:
    """Pickle an h5py Group, Dataset or Datatype as (its file, its path in the file)."""
    if not obj.id.valid:
        raise TypeError(f"cannot pickle a closed h5py object for a DataLoader worker, got {obj!r}")
    if obj.name is None:
        raise TypeError(
            f"cannot reopen the anonymous HDF5 object {obj!r} in a spawn/forkserver worker: link it into the file"
        )
    return reopen_object, (obj.file, obj.name)


def reopen_object(file: Any, name: str) -> Any:
    if isinstance(file, _reopen.Unavailable):
        return file
    return file[name]


class H5pyBackend(Backend):
    name = NAME
    description = 'HDF5 files the parent holds writable are made read-only in workers, with a warning'
    # Before "files" privatizes the read-only descriptors, it makes those of writable files read-only.
    first = True
    runs_after = (SOCKETS,)
    requires = ("h5py",)
    plan_per_start = True  # its plan, the writable files prepare_start found, holds for the whole start
    libraries = (
        Library(
            ("libhdf5", "h5py"),
            label="HDF5",
            stall="the worker waits in h5py/HDF5, most likely on HDF5's global lock, held by another parent "
            "thread at the moment of the fork, or on a file handle inherited from the parent.",
            remedy="do not use h5py from other threads while workers start",
        ),
    )

    def __init__(self) -> None:
        self.writable: Inodes = frozenset()
        """The files the parent held writable when a loader last started fork workers."""
        self._warned: set[str] = set()  # paths warned about, once per process
        self._reopened: dict[tuple[Any, ...], Any] = {}
        """In a spawn/forkserver worker, one reopened File per (path, parameters): a Dataset's File,
        and the File behind each of its Dataset objects, are the same handle again (``reopen_file``)."""

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        if "h5py" not in sys.modules:
            return
        import h5py

        if start_method == "fork":
            self.writable = frozenset(_writable_files(_hooks.hook_runs(NAME, options), self._warned))
        else:
            for cls in (h5py.File, h5py.Group, h5py.Dataset, h5py.Datatype):
                _reopen.register_reducer(cls, reduce_object if cls is not h5py.File else reduce_file)

    def before(self, ctx: ForkContext) -> Inodes:
        return self.writable or self.NOTHING_TO_DO

    def after_in_child(self, ctx: ForkContext, plan: Inodes | None) -> None:
        protect_writable_files(plan or frozenset())

    def hazards(self) -> list[Hazard]:
        """Open files: a writable one is this hook's; a read-only one the "files" hook's."""
        h5py: Any = sys.modules.get("h5py")
        try:
            ids = h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE) if h5py is not None else ()
        except Exception:  # h5py internals differ: report nothing rather than fail the doctor
            return []
        found = []
        for fid in ids:
            try:
                name = fid.name.decode() if isinstance(fid.name, bytes) else str(fid.name)
                mode = "r+" if fid.get_intent() != h5py.h5f.ACC_RDONLY else "r"
            except Exception:
                continue
            what = f"open h5py file {name} (mode {mode!r}): workers would share the parent's HDF5 handle"
            if mode == "r":
                hazard = Hazard("open file", "h5py", what, FILES, "each worker reads it through its "
                                "own file offset", "open the file in the worker")
            else:
                hazard = Hazard("open file", "h5py", what, otherwise="close the file before the loader starts")
            found.append(hazard)
        return found


BACKEND = H5pyBackend()
