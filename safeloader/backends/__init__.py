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
import sys
from types import ModuleType
from typing import Any

from .._registry import register_at_fork

# Modules under safeloader.backends, registered in this order at import of safeloader.
BUILTIN: tuple[str, ...] = (
    "zarrs", "polars", "sockets", "files", "h5py", "npz", "lmdb", "fsspec",
    "threadpools", "torch_state", "gc_freeze", "pin_memory",
)

_modules: list[ModuleType] = []


def _watchdog_enter_worker() -> None:
    # safeloader.watchdog is imported by the loader that armed this fork;
    # importing it here for nothing would cost every plain import of safeloader.
    watchdog = sys.modules.get("safeloader.watchdog")
    if watchdog is not None:
        watchdog.enter_worker_at_fork()


def register_builtin() -> None:
    # First among after_in_child hooks, so that a hang in a later hook or in
    # worker_init_fn is diagnosed with stacks too.
    register_at_fork(after_in_child=_watchdog_enter_worker, name="watchdog", priority=1_000_000)
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
