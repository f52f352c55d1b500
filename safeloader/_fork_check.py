"""``on_unsafe_fork``: before a loader forks its workers, what its parent holds that a forked worker would
inherit broken and no backend resets; then raise, switch to a preloaded forkserver, or warn (why: docs/internals.md)."""

from __future__ import annotations

import functools
import multiprocessing
import os
import re
import sys
import threading
import warnings
import weakref
from typing import Any

from . import _hooks, _imports, backends, forkstate, native
from ._options import Options
from .backends import threadpools
from .backends._backend import Backend
from .diagnostics import native_libraries, native_pools, thread_owners  # not lazily: the first start would import them
from .diagnostics.unsafe_fork import Hazard, UnsafeForkWarning, remedies
from .errors import UnsafeForkError

__all__ = ["apply", "hazards"]

PRELOAD = ("torch", "torch.utils.data")

_lock = threading.Lock()
_warned: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_owners: list[str] = []  # packages owning the pools last found: preloaded by the forkserver


def _backend_active(name: str, options: Options) -> bool:
    return _hooks.hook_runs(name, options)


def _hazard(library: str, count: int, options: Options, loader: Any) -> tuple[Hazard | None, bool]:
    """(the hazard of ``library``'s live threads or None, whether the answer depended on ``loader``)."""
    entry, package, _ = native_libraries.classify((library,))
    per_loader = False
    if entry is not None:
        if entry.fork == native_libraries.SURVIVES:
            return None, False
        if entry.fork == native_libraries.HANDLED:
            # GNU OpenMP's idle threads are harmless: its hazard, a parallel region the parent ran,
            # is checked from forkstate's record below (hazards).
            if entry.alone or _is_gomp(library):
                return None, False
            if not _backend_active(entry.by, options):
                note = f"its backend {entry.by!r} is off for this loader"
            else:
                note, per_loader = _uncovered(entry.by, loader)
                if not note:
                    return None, per_loader
        else:
            note = entry.by + (f"; its own fork-safe setting: {entry.remedy}" if entry.remedy else "")
    else:
        note = ""
    package = native_libraries.package_of(library)  # from its modules ("polars", not its runtime's folder)
    kinds = native_pools.runtimes(library)
    what = native_pools.describe(library, kinds)
    if package != os.path.basename(library):
        what += f" ({os.path.basename(library)})"
    aborts = entry is not None and entry.fork == native_libraries.ABORTS
    return Hazard(library, package, count, what, note, aborts, known=entry is not None or bool(kinds)), per_loader


def _uncovered(backend_name: str, loader: Any) -> tuple[str, bool]:
    """(why the backend ``backend_name`` leaves its libraries' live threads a hazard for ``loader``
    or '', whether it was asked: it overrides ``Backend.uncovered``, so the answer is the loader's)."""
    backend = backends.get(backend_name)
    if backend is None or type(backend).uncovered is Backend.uncovered:
        return "", False
    return backend.uncovered(loader), True


def _is_gomp(library: str) -> bool:
    return os.path.basename(library).startswith("libgomp")


def hazards(options: Options, loader: Any = None, forking: bool = False) -> list[Hazard]:
    """What this process holds that a forked worker of ``loader`` would inherit broken and no active
    backend resets (the last answer while nothing it depends on changed). ``forking``: asked right
    before this process forks the workers (``apply``)."""
    global _last
    key = _state_key(options)
    last = _last
    if key is not None and last is not None and last[0] == key:
        return list(last[1])
    found, attributed, per_loader = _hazards(options, loader, forking)
    # Kept only where every native thread's library was found (one not found, still running at the
    # census, is asked again at the next call), and where no backend's answer depended on the loader.
    if key is not None and attributed == len(key[0]) and not per_loader:
        _last = (key, tuple(found))
    else:
        _last = None
    return found


_last: tuple[tuple[Any, ...], tuple[Hazard, ...]] | None = None
"""(``_state_key``, what ``hazards`` found) at its last call: module state, as what it depends on
(threads, loaded libraries, backends) is the process's."""


def _state_key(options: Options) -> tuple[Any, ...] | None:
    """What ``hazards(options)`` depends on, as one comparable value (docs/internals.md, ``safeloader._fork_check``);
    None where GNU OpenMP's state is read instead, or the dynamic loader's counters cannot be read."""
    counters = native.loaded_counters()
    if counters is None or not _backend_active(threadpools.NAME, options):
        return None
    return (
        native.foreign_thread_ids(), counters, _imports.modules_state(), _hooks.version,
        native_libraries.version, tuple(native_libraries.used_runtimes()), options,
    )


def _hazards(options: Options, loader: Any, forking: bool = False) -> tuple[list[Hazard], int, bool]:
    """(what ``hazards`` finds, how many native threads' libraries were found, whether a backend was
    asked about the loader)."""
    found = []
    per_loader = False
    # Right before the fork, a thread seen running is not waited for (up to 50 ms) before the pools
    # the fork itself stops are stopped: OpenBLAS's threads spin for about 0.1 s after a BLAS call.
    before_waiting = functools.partial(_stop_openblas_servers, options) if forking else None
    with _lock:
        _owners.clear()
        live = thread_owners.live_libraries(before_waiting)
        attributed = sum(live.values())
        # A pool that runs on another library's threads (numba's on GNU OpenMP's): found by its state.
        gomp_threads = sum(count for library, count in live.items() if _is_gomp(library))
        for library in native_libraries.used_runtimes():
            live.setdefault(library, gomp_threads)
        for library, count in sorted(live.items()):
            if native_libraries.is_system(library):
                continue
            hazard, asked_loader = _hazard(library, count, options, loader)
            per_loader = per_loader or asked_loader
            if hazard is not None:
                found.append(hazard)
                _owners.append(hazard.package)
    if not _backend_active(threadpools.NAME, options):
        state = forkstate.snapshot(pools=False, count_frozen=False)
        # Off because threadpoolctl is missing: say so, with the command that installs it.
        why = threadpools.status().partition("inactive: ")[2]
        note = "its backend 'threadpools' is off" + (f": {why}" if why else "")
        for path in state.gomp_live:
            name = os.path.basename(path)
            what = f"GNU OpenMP ({name}) with live pool threads"
            found.append(Hazard(path, name, 1, what, note))
    return found, attributed, per_loader


def _stop_openblas_servers(options: Options) -> None:
    """What each pthreads OpenBLAS's own fork handler does at the fork about to happen, done before
    the fork-time check reads the threads (``_blas_pools.stop_openblas_servers``); only where the
    "threadpools" backend runs for this loader, whose pools these are."""
    if _backend_active(threadpools.NAME, options):
        threadpools.stop_openblas_servers()


_MAIN_GUARD = re.compile(r"""__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__""")


def _forkserver_unusable(loader: Any) -> str | None:
    """Why ``loader``'s workers cannot start under a forkserver (no ``__main__`` guard, a main module
    without a file), or None when they can."""
    from multiprocessing.reduction import ForkingPickler

    try:
        payload = bytes(ForkingPickler.dumps((loader.dataset, loader.collate_fn, loader.worker_init_fn)))
    except Exception as exc:  # any pickling failure: TypeError, PicklingError, AttributeError...
        return f"the Dataset does not pickle ({type(exc).__name__}: {exc})"
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        if b"__main__" in payload:
            return "the Dataset uses code defined in a main module that has no file (python -c, a notebook)"
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as script:
            guarded = _MAIN_GUARD.search(script.read()) is not None
    except OSError:
        guarded = False
    if not guarded:
        return (
            f"the main script {os.path.basename(path)} has no `if __name__ == \"__main__\":` guard, and "
            "forkserver workers run it again"
        )
    return None


def apply(loader: Any, options: Options, start_method: str) -> tuple[Hazard, ...]:
    """Before ``loader`` forks its workers: raise, switch them to a preloaded forkserver, or warn; returns
    what its forked workers will lack (with "warn" and "ignore"), for the stall watchdog."""
    policy = options.on_unsafe_fork
    if start_method != "fork":
        return ()
    found = hazards(options, loader, forking=True)
    if not found:
        return ()
    if policy == "ignore":
        return tuple(found)
    held = "; ".join(str(hazard) for hazard in found)
    fate = (
        "is terminated by the library itself (torch's own loader's workers die there too)"
        if all(hazard.aborts for hazard in found)
        else "waits forever, or is terminated by the library (torch's own loader fails there too)"
        if any(hazard.aborts for hazard in found)
        else "waits forever (torch's own loader hangs there too)"
        if any(hazard.known for hazard in found)
        else "may wait forever: safeloader does not know whether this library's threads are needed in a "
        "forked child (where they are, torch's own loader hangs there too)"
    )
    stuck = (
        f"safeloader: DataLoader workers would be forked from a process holding {held}. Nothing resets "
        f"it in a forked worker: a worker that uses it {fate}."
    )
    if policy == "auto":
        reason = _forkserver_unusable(loader)
        if reason is not None:
            raise UnsafeForkError(
                f"{stuck} The workers were not started, and cannot be started with a forkserver instead: "
                f"{reason}.{remedies(found)}",
                libraries=tuple(str(h) for h in found),
            )
        switched = f"{stuck} Its workers start with a preloaded forkserver instead (slower to start, correct)."
        _warn(loader, found, switched + remedies(found))
        policy = "forkserver"
    if policy == "raise":
        raise UnsafeForkError(
            f"{stuck} The workers were not started.{remedies(found)}", libraries=tuple(str(h) for h in found)
        )
    if policy == "forkserver":
        object.__setattr__(loader, "multiprocessing_context", forkserver_context(loader))
        return ()
    _warn(loader, found, f"{stuck} Forked anyway (on_unsafe_fork='warn').{remedies(found)}")
    return tuple(found)


def _warn(loader: Any, found: list[Hazard], message: str) -> None:
    """Once per loader and library."""
    try:
        warned = _warned.setdefault(loader, set())
    except TypeError:  # a loader that cannot be weakly referenced: warn every time
        warned = set()
    fresh = [hazard.what for hazard in found if hazard.what not in warned]
    if fresh:
        warned.update(fresh)
        warnings.warn(message, UnsafeForkWarning, stacklevel=5)  # apply, start_armed, _get_iterator, __iter__, the user


def forkserver_context(loader: Any) -> Any:
    """multiprocessing's forkserver context, preloaded with torch, the Dataset's module and the packages
    whose pools made the fork unsafe (imported in the server, their pools not started)."""
    preload = list(PRELOAD)
    for module in [*(name for name in _owners if name in sys.modules), type(loader.dataset).__module__]:
        if module and module != "__main__" and module not in preload:
            preload.append(module)
    multiprocessing.set_forkserver_preload(preload)
    return multiprocessing.get_context("forkserver")
