"""Built-in backends: one module per native library, each declaring one ``Backend`` (``_backend``).

A backend module imports nothing of its library at import time: its hook
declares ``requires=(...)`` and runs only when the program imported the
library. Adding a backend is adding its module to ``BUILTIN``.
"""

from __future__ import annotations

import importlib
from typing import Any

from .. import forkstate
from .._options import Options
from ._backend import Backend

# Modules under safeloader.backends, registered in this order at import of safeloader.
BUILTIN: tuple[str, ...] = (
    "zarrs", "polars", "sockets", "files", "h5py", "npz", "lmdb", "fsspec",
    "threadpools", "executors", "torch_state", "gc_freeze", "pin_memory",
)

_backends: list[type[Backend]] = []


def register_builtin() -> None:
    """Register every built-in backend's fork hook, and the parent-state record they share."""
    forkstate.register()
    for name in BUILTIN:
        backend = importlib.import_module(f"{__name__}.{name}").BACKEND
        backend.register()
        _backends.append(backend)


def prepare_start(loader: Any, options: Options, start_method: str) -> None:
    """Let each built-in backend act before ``loader`` starts workers with ``start_method``."""
    for backend in _backends:
        backend.prepare_start(loader, options, start_method)


def status(name: str) -> str:
    """The built-in backend ``name``'s own word on how it stands ('' if none, or no such backend)."""
    return next((backend.status() for backend in _backends if backend.name == name), "")
