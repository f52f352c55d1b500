"""npz: ``np.load("x.npz")`` archives opened in the parent work in every worker (why: docs/internals.md)."""

from __future__ import annotations

import os
import sys
from typing import Any

from .._options import Options
from . import _reopen
from ._backend import Backend, Hazard
from .files import NAME as FILES

NAME = "npz"


def reduce_npz(npz: Any) -> tuple[Any, ...]:
    """Pickle an open ``NpzFile`` by path, or by the file object it reads."""
    if npz.zip is None or npz.zip.fp is None:
        raise TypeError(f"cannot pickle a closed NpzFile for a DataLoader worker, got {npz!r}")
    settings = {"allow_pickle": npz.allow_pickle, "pickle_kwargs": npz.pickle_kwargs}
    if hasattr(npz, "max_header_size"):
        settings["max_header_size"] = npz.max_header_size
    fid = npz.fid
    if fid is not None:  # opened by np.load from a path
        path = os.fsdecode(fid.name)
        return reopen_npz, (path, _reopen.FileIdentity.of_fd(fid.fileno()), settings)
    return reopen_npz, (npz.zip.fp, None, settings)  # the file object pickles itself (or refuses)


def reopen_npz(source: Any, identity: _reopen.FileIdentity | None, settings: dict[str, Any]) -> Any:
    """In a spawn/forkserver worker: the ``NpzFile`` the parent pickled."""
    from numpy.lib.npyio import NpzFile

    if identity is None:
        if isinstance(source, _reopen.Unavailable):
            return source
        return NpzFile(source, own_fid=False, **settings)

    def opener() -> Any:
        fid = open(source, "rb")
        try:
            identity.check(source, _reopen.FileIdentity.of_fd(fid.fileno()))
            return NpzFile(fid, own_fid=True, **settings)
        except BaseException:
            fid.close()
            raise

    return _reopen.reopen_or_unavailable("npz archive", source, opener)


class NpzBackend(Backend):
    """No fork hook of its own (the "files" hook privatizes the archive's descriptor):
    only pickling support for spawn/forkserver workers."""

    name = NAME
    description = "npz archives opened in the parent are reopened in spawn/forkserver workers"

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        if start_method != "fork" and "numpy" in sys.modules:
            from numpy.lib.npyio import NpzFile

            _reopen.register_reducer(NpzFile, reduce_npz)

    def hazards(self) -> list[Hazard]:
        """Open archives: the "files" hook gives each worker its own file offset."""
        import gc

        npyio = getattr(getattr(sys.modules.get("numpy"), "lib", None), "npyio", None)
        npz_type = getattr(npyio, "NpzFile", None)
        if npz_type is None:
            return []
        found = []
        for obj in gc.get_objects():
            # type(), not isinstance(): some objects (NpzFile.f) fail every attribute lookup.
            if issubclass(type(obj), npz_type) and getattr(obj, "zip", None) is not None:
                path = getattr(obj.fid, "name", None) or getattr(obj.zip, "filename", None) or "<file object>"
                what = f"open npz archive {path}: workers would share one file offset (BadZipFile, wrong data)"
                found.append(Hazard("open file", "numpy npz", what, FILES, "each worker reads the "
                                    "archive through its own file offset", "open the archive in the worker"))
        return found


BACKEND = NpzBackend()
