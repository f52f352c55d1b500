"""Built-in backends: one module per native library, each registering its fork hooks.

A backend module imports nothing of its library at import time: its hooks
declare ``requires=(...)`` and run only when the program imported the library.

Each module defines ``register()``, which registers its fork hooks, and may
define ``prepare_start(loader, start_method)``, called in the parent before a
safeloader-armed loader starts its workers, whatever the start method ("fork",
"spawn" or "forkserver"): the place for checks that must fail before any
worker exists, and for pickling support that spawn/forkserver need.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

# Modules under safeloader.backends, registered in this order at import of safeloader.
BUILTIN: tuple[str, ...] = (
    "zarrs", "polars", "sockets", "files", "h5py", "npz", "lmdb", "fsspec",
    "threadpools", "torch_state", "gc_freeze", "pin_memory",
)

_modules: list[ModuleType] = []


def register_builtin() -> None:
    for name in BUILTIN:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register()
        _modules.append(module)


def prepare_start(loader: Any, start_method: str) -> None:
    """Let each built-in backend act before ``loader`` starts workers with ``start_method``."""
    for module in _modules:
        prepare = getattr(module, "prepare_start", None)
        if prepare is not None:
            prepare(loader, start_method)
