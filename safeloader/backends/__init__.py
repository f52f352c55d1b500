"""Built-in backends: one module per native library, each declaring one ``Backend`` (``_backend``).

A backend module imports nothing of its library at import time: its hook
declares ``requires=(...)`` and runs only when the program imported the
library. Adding a backend is adding its module to ``BUILTIN``.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from .._hooks import Hook, get_hook
from .._options import Options
from ..errors import RegistrationError
from ._backend import Backend

# Modules under safeloader.backends, registered in this order at import of safeloader.
BUILTIN: tuple[str, ...] = (
    "forkstate", "zarrs", "polars", "sockets", "files", "h5py", "npz", "lmdb", "fsspec",
    "threadpools", "executors", "torch_state", "gc_freeze", "pin_memory", "blosc2", "pyav",
)

_backends: list[Backend] = []
_lock = threading.Lock()  # two threads registering backends at once: neither registration is lost


def register_builtin() -> None:
    """Register every built-in backend's fork hook."""
    for name in BUILTIN:
        backend = importlib.import_module(f"{__name__}.{name}").BACKEND
        with _lock:
            backend.register()
            _backends.append(backend)


def register(backend: type[Backend] | Backend) -> Hook | None:
    """Register a backend of your own (``safeloader.register_backend``): a ``safeloader.Backend``
    subclass (made with no arguments) or instance, whose fork hook is registered as its phases say
    and whose ``prepare_start`` and ``status`` run as the built-ins' do. Registering a backend of
    the same name replaces it. Returns its hook (None for a backend that only prepares starts)."""
    if isinstance(backend, type) and issubclass(backend, Backend):
        backend = backend()
    if not isinstance(backend, Backend):
        raise RegistrationError(f"backend must be a safeloader.Backend subclass or instance, got {backend!r}")
    for attribute in ("name", "description"):
        value = getattr(backend, attribute, None)
        if not isinstance(value, str) or not value:
            raise RegistrationError(f"{type(backend).__name__}.{attribute} must be a non-empty str, got {value!r}")
    with _lock:
        hook = backend.register()
        _backends[:] = [*(known for known in _backends if known.name != backend.name), backend]
    return hook


def get(name: str) -> Backend | None:
    """The registered backend called ``name``, or None."""
    return next((backend for backend in _backends if backend.name == name), None)


def prepare_start(loader: Any, options: Options, start_method: str) -> None:
    """Let each backend act before ``loader`` starts workers with ``start_method`` (but one whose
    hook was unregistered: ``safeloader.unregister`` removes a backend)."""
    for backend in _backends:
        if backend.has_hook() and get_hook(backend.name) is None:
            continue
        backend.prepare_start(loader, options, start_method)


def status(name: str) -> str:
    """The backend ``name``'s own word on how it stands ('' if none, or no such backend)."""
    return next((backend.status() for backend in _backends if backend.name == name), "")


def registered() -> tuple[Backend, ...]:
    """The registered backends, built-in and yours, in registration order."""
    return tuple(_backends)
