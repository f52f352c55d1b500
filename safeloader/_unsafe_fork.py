"""``on_unsafe_fork``: what a loader does when its parent holds a pool no backend can reset.

Checked in the parent when a loader is about to fork its workers:

- a live rayon pool or tokio runtime of an extension module whose library no
  active backend handles (any Rust extension; polars and zarrs have backends):
  a forked worker's first parallel call in it hangs;
- GNU OpenMP with live pool threads while the "threadpools" backend is off
  for the loader.

"warn" (default) forks and warns once per loader and library with an
``UnsafeForkWarning`` naming the library and the option; "forkserver" starts
the workers with forkserver instead, preloaded with torch, torch.utils.data
and the Dataset's module; "ignore" forks silently.

``sys.modules`` is passed over again only when modules were imported since
the last check; each extension library is scanned once per process
(``native_pools.runtimes``), and threads are attributed once per thread.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import warnings
import weakref
from typing import Any

from ._imports import modules_state
from ._options import Options

__all__ = ["UnsafeForkWarning", "apply", "hazards"]

PRELOAD = ("torch", "torch.utils.data")


class UnsafeForkWarning(RuntimeWarning):
    """Workers are forked from a parent holding a pool that no safeloader backend resets."""


_lock = threading.Lock()
_modules_seen: tuple[int, str, object] | None = None
_risky: tuple[str, ...] = ()  # extension libraries linking a rayon/tokio runtime
_thread_owner: dict[int, tuple[str, ...]] = {}  # tid -> libraries on its stack (threads keep their owner)
_warned: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_owners: list[str] = []  # packages owning the pools last found: preloaded by the forkserver


def _risky_libraries() -> tuple[str, ...]:
    """Extension modules' libraries that link a rayon pool or tokio runtime, found again after imports."""
    global _modules_seen, _risky
    state = modules_state()
    if state == _modules_seen:
        return _risky
    from . import native_pools

    paths = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.endswith(".so") and os.path.isfile(file):
            paths.add(os.path.realpath(file))
    _risky = tuple(sorted(path for path in paths if native_pools.runtimes(path)))
    _modules_seen = state
    return _risky


def _backend_active(name: str, options: Options) -> bool:
    from . import _registry

    return _registry.hook_runs(name, options)


def _libraries_of_threads() -> dict[int, tuple[str, ...]]:
    from . import native
    from .doctor import thread_libraries  # "from . import doctor" gives safeloader.doctor(), the function

    tids = [tid for tid, _ in native.thread_census().foreign]
    new = [tid for tid in tids if tid not in _thread_owner]
    if new:
        for tid, libraries in thread_libraries(new).items():
            _thread_owner[tid] = tuple(os.path.realpath(lib) for lib in libraries)
    return {tid: _thread_owner.get(tid, ()) for tid in tids}


def hazards(options: Options) -> list[str]:
    """What this process holds that a forked worker would inherit broken and no active backend resets."""
    from . import native_pools

    found = []
    with _lock:
        risky = [lib for lib in _risky_libraries() if not _backend_active(native_pools.owner(lib), options)]
        _owners.clear()
        if risky:
            threads = _libraries_of_threads()
            for library in risky:
                live = [tid for tid, libraries in threads.items() if library in libraries]
                if live:
                    kinds = native_pools.runtimes(library)
                    found.append(f"{native_pools.describe(library, kinds)} ({len(live)} live thread(s))")
                    _owners.append(native_pools.owner(library))
    if not _backend_active("threadpools", options):
        from . import forkstate

        state = forkstate.snapshot(pools=False, count_frozen=False)
        found += [f"GNU OpenMP ({os.path.basename(path)}) with live pool threads" for path in state.gomp_live]
    return found


def apply(loader: Any, options: Options, start_method: str) -> None:
    """Before ``loader`` forks its workers: warn, or switch them to a preloaded forkserver."""
    if start_method != "fork" or options.on_unsafe_fork == "ignore":
        return
    found = hazards(options)
    if not found:
        return
    if options.on_unsafe_fork == "forkserver":
        object.__setattr__(loader, "multiprocessing_context", forkserver_context(loader))
        return
    try:
        warned = _warned.setdefault(loader, set())
    except TypeError:  # a loader that cannot be weakly referenced: warn every time
        warned = set()
    fresh = [hazard for hazard in found if hazard.split(" (")[0] not in warned]
    if fresh:
        warned.update(hazard.split(" (")[0] for hazard in fresh)
        warnings.warn(
            "safeloader: DataLoader workers are forked from a process holding "
            + "; ".join(fresh)
            + ". No safeloader backend resets it, so a worker that uses it hangs (the stall watchdog names "
            "it). Pass on_unsafe_fork='forkserver' to the loader (or safeloader.configure(on_unsafe_fork="
            "'forkserver')) to start these workers with a preloaded forkserver instead, or "
            "on_unsafe_fork='ignore' if the workers never use it.",
            UnsafeForkWarning,
            stacklevel=5,  # apply, start_armed, _get_iterator, DataLoader.__iter__, the user
        )


def forkserver_context(loader: Any) -> Any:
    """multiprocessing's forkserver context, preloaded with torch, the Dataset's module and the
    packages whose pools made the fork unsafe (imported in the server, their pools not started).

    The preload list applies when the server starts (the first forkserver
    start in this process); later loaders reuse the server.
    """
    preload = list(PRELOAD)
    for module in [*(name for name in _owners if name in sys.modules), type(loader.dataset).__module__]:
        if module and module != "__main__" and module not in preload:
            preload.append(module)
    multiprocessing.set_forkserver_preload(preload)
    return multiprocessing.get_context("forkserver")
