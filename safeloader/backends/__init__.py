"""Built-in backends: the modules of this package without a leading underscore, each defining
``BACKEND``, a ``Backend`` that imports nothing of its library until the program did."""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

from .._hooks import Hook, get_hook
from .._options import Options
from ..errors import RegistrationError
from ._backend import Backend


def discover(folder: str) -> tuple[str, ...]:
    """The backend modules in ``folder``: its ``.py`` files without a leading underscore, by name."""
    # A listing of the folder, not pkgutil or an import of each candidate: importing safeloader stays cheap.
    return tuple(sorted(
        entry[:-3] for entry in os.listdir(folder) if entry.endswith(".py") and not entry.startswith("_")
    ))


BUILTIN: tuple[str, ...] = discover(os.path.dirname(__file__))
"""The built-in backends' modules, registered in this order (by name) at import of safeloader. Where
their hooks run around a fork is what each declares (``first``, ``last``, ``runs_after``), not this order."""

_backends: list[Backend] = []
_lock = threading.Lock()  # two threads registering backends at once: neither registration is lost


def register_builtin() -> None:
    """Register every built-in backend's fork hook."""
    for name in BUILTIN:
        module = importlib.import_module(f"{__name__}.{name}")
        backend = getattr(module, "BACKEND", None)
        if not isinstance(backend, Backend):
            raise RegistrationError(
                f"{module.__name__} must define BACKEND, a Backend instance (a helper module's name starts "
                f"with an underscore), got {backend!r}"
            )
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
