"""safeloader: PyTorch DataLoader workers that fork fast and safely.

``from safeloader import DataLoader`` gives ``SafeDataLoader``, torch's DataLoader whose worker
forks run registered fork hooks; ``safeloader.install()`` arms every DataLoader in the process.
Importing it imports neither torch (until the loader is used) nor any backend library."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _dispatch, _hooks, _options  # noqa: F401 (_dispatch: its one os.register_at_fork registration)
from ._context import ForkContext, fork_context
from ._hooks import FastFork, Hook, disable, enable, hooks, register_at_fork, unregister
from ._options import Options, get_options
from .errors import HookError, RegistrationError, UnsafeForkError, WorkerStallError, WorkerStoppedWarning
from .native import NATIVE

__version__ = "0.1.0"


def configure(**options: object) -> Options:
    """Set process-wide defaults for every loader, e.g. ``configure(zarrs_mode="serial", thread_budget=2)``;
    returns the previous ones (pass their fields back to restore)."""
    updated = get_options().replace(**options)
    if "disable_hooks" in options:
        _hooks.check_hook_names(updated.disable_hooks)
    return _options.set_defaults(updated)

if TYPE_CHECKING:
    from ._doctor import doctor
    from ._install import install, installed, uninstall
    from ._loader import DEFAULT, SafeDataLoader
    from .backends import register as register_backend
    from .backends._backend import Backend, Hazard
    from .diagnostics.native_libraries import Library
    from .diagnostics.unsafe_fork import UnsafeForkWarning

    DataLoader = SafeDataLoader

_LAZY = {
    "DataLoader": ("._loader", "SafeDataLoader"),
    "SafeDataLoader": ("._loader", "SafeDataLoader"),
    "DEFAULT": ("._loader", "DEFAULT"),
    "install": ("._install", "install"),
    "uninstall": ("._install", "uninstall"),
    "installed": ("._install", "installed"),
    "doctor": ("._doctor", "doctor"),
    "UnsafeForkWarning": (".diagnostics.unsafe_fork", "UnsafeForkWarning"),
    "Backend": (".backends._backend", "Backend"),
    "Hazard": (".backends._backend", "Hazard"),
    "Library": (".diagnostics.native_libraries", "Library"),
    "register_backend": (".backends", "register"),
}


def __getattr__(name: str) -> Any:
    # The loader names import torch; everything else works without it.
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'safeloader' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DEFAULT",
    "Backend",
    "NATIVE",
    "DataLoader",
    "FastFork",
    "ForkContext",
    "Hazard",
    "Hook",
    "HookError",
    "Library",
    "Options",
    "RegistrationError",
    "SafeDataLoader",
    "UnsafeForkError",
    "UnsafeForkWarning",
    "WorkerStallError",
    "WorkerStoppedWarning",
    "configure",
    "disable",
    "doctor",
    "enable",
    "fork_context",
    "get_options",
    "hooks",
    "install",
    "installed",
    "register_at_fork",
    "register_backend",
    "uninstall",
    "unregister",
]

from . import backends as _backends  # noqa: E402
from . import watchdog as _watchdog  # noqa: E402

_watchdog.register()
_backends.register_builtin()
