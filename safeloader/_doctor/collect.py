"""The findings of ``safeloader doctor`` as plain data (what ``--json`` prints)
(why: docs/internals.md, ``safeloader._doctor``)."""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import sys
import time
from collections.abc import Iterable
from typing import Any

from .. import _hooks as hook_registry
from .. import _torch_internals, backends, forkstate, native
from .._options import get_options
from .live_at_fork import hazards, summary

__all__ = ["collect"]

DISTRIBUTIONS = ("torch-safeloader", "torch", "numpy", "zarr", "zarrs", "h5py", "threadpoolctl")
_UNKNOWN_RETRIES = 2
_UNKNOWN_PAUSE = 0.05


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["native extension"] = "built" if native.NATIVE else "not built (pure-Python fallback)"
    found["exit-handler lock"] = (  # glibc's: see csrc/exit_lock.c
        "found: each fork child releases it if another thread held it"
        if native.exit_handler_lock()[0]
        else "not found: a worker forked while another thread registers an exit handler can hang"
    )
    return found


def _start_method() -> dict[str, Any]:
    import torch.multiprocessing

    explicit = torch.multiprocessing.get_start_method(allow_none=True)
    default = _torch_internals.start_method()
    safeloader_uses = _torch_internals.safeloader_start_method()  # the loader's own rule
    why = (
        "safeloader forks workers on Linux unless a start method was set explicitly"
        if safeloader_uses == "fork" and default != "fork"
        else "the process default"
    )
    return {
        "torch_default": default,
        "set_explicitly": explicit,
        "safeloader": safeloader_uses,
        "why": why,
        "hooks_run": safeloader_uses == "fork",
    }


def _hooks() -> list[dict[str, Any]]:
    options = get_options()
    rows = []
    for hook in hook_registry.hooks():
        phases = [p for p in hook_registry.PHASES if getattr(hook, p) is not None]
        missing = [m for m in hook.requires if m not in sys.modules]
        if not hook.enabled:
            state = "disabled (safeloader.disable)"
        elif hook.name in options.disable_hooks:
            state = "disabled (configure(disable_hooks=...))"
        elif missing:
            state = f"idle: runs once {', '.join(missing)} is imported"
        else:
            state = "active"
        said = backends.status(hook.name)  # a backend's own word, e.g. threadpoolctl missing
        if said and not said.startswith("active"):
            state += f"; {said}"
        rows.append(
            {
                "name": hook.name,
                "active": hook.active and hook.name not in options.disable_hooks,
                "state": state,
                "phases": phases,
                "requires": list(hook.requires),
                "order": "first" if hook.first else "last" if hook.last else "",
                "runs_after": list(hook.runs_after),
                "does": hook.description or "user hook",
            }
        )
    return rows


def collect(imports: Iterable[str] = ()) -> dict[str, Any]:
    """The doctor's findings as plain data (what ``--json`` prints). Imports ``imports`` first."""
    for name in imports:
        importlib.import_module(name)
    import torch.utils.data  # noqa: F401  (hooks that require torch are listed as a loader sees them)

    # A thread a pool has just started may not have reached its library's code yet (none of it on
    # its stack, not waiting in it): looked at again, twice, 50 ms apart, before it is called unknown.
    for attempt in range(_UNKNOWN_RETRIES + 1):
        state = forkstate.snapshot(pools=True)
        live = hazards(state)
        if attempt == _UNKNOWN_RETRIES or not any(h["status"] == "unknown" for h in live):
            break
        time.sleep(_UNKNOWN_PAUSE)
    return {
        "versions": _versions(),
        "start_method": _start_method(),
        "options": get_options().as_dict(),
        "hooks": _hooks(),
        "live_at_fork": live,
        "summary": summary(live),
        "process": {
            "pid": state.pid,
            "python_threads": [name for _, name in state.python_threads],
            "native_threads": len(state.native_threads),
            "pools": [
                {"library": p.internal_api, "api": p.user_api, "threads": p.num_threads, "path": p.filepath}
                for p in state.pools or ()
            ],
            "notes": list(state.notes),
        },
    }
