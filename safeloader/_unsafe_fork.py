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

Only libraries that own a live native thread are looked at: each thread is
attributed once to the object it waits for (``thread_owners``, read from /proc
without stopping it), and only an extension module's library that no active
backend handles is read, once per process (``native_pools.runtimes``). A
parent with no such thread opens no file here.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import warnings
import weakref
from typing import Any

from ._options import Options

__all__ = ["UnsafeForkWarning", "apply", "hazards"]

PRELOAD = ("torch", "torch.utils.data")


class UnsafeForkWarning(RuntimeWarning):
    """Workers are forked from a parent holding a pool that no safeloader backend resets."""


# Thread pools of libraries other backends handle (BLAS and OpenMP runtimes: "threadpools",
# below; torch's own pools: "torch"): a thread waiting in one is attributed without a look at
# the imported modules.
_HANDLED_POOLS = ("libgomp", "libomp", "libiomp", "libopenblas", "libscipy_openblas", "libmkl", "libtorch", "libc10")

_lock = threading.Lock()
_warned: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_owners: list[str] = []  # packages owning the pools last found: preloaded by the forkserver


def _backend_active(name: str, options: Options) -> bool:
    from . import _registry

    return _registry.hook_runs(name, options)


def _live_libraries() -> dict[str, int]:
    """Object each live native thread waits for -> how many threads."""
    from . import native, thread_owners

    counts: dict[str, int] = {}
    for library in thread_owners.owners(native.thread_census().foreign).values():
        if library is not None:
            counts[library] = counts.get(library, 0) + 1
    return counts


def hazards(options: Options) -> list[str]:
    """What this process holds that a forked worker would inherit broken and no active backend resets."""
    from . import native_pools

    found = []
    with _lock:
        _owners.clear()
        for library, count in sorted(_live_libraries().items()):
            if os.path.basename(library).startswith(_HANDLED_POOLS) or not native_pools.extension_modules(library):
                continue  # not a Python extension's own object: BLAS, OpenMP, torch's pools (backends, below)
            package = native_pools.owner(library)
            if _backend_active(package, options):
                continue
            kinds = native_pools.runtimes(library)
            if kinds:
                found.append(f"{native_pools.describe(library, kinds)} ({count} live thread(s))")
                _owners.append(package)
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
