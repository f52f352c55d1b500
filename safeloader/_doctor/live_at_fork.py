"""What is live in this process at fork, each with its status, for ``safeloader doctor``
(why: docs/internals.md, ``safeloader._doctor``)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from typing import Any

from .. import _hooks, backends, forkstate
from .._options import get_options
from ..backends._backend import Hazard
from ..diagnostics import native_libraries, stacks

__all__ = ["UNSAFE_FORK_WILL", "hazards", "summary", "thread_libraries"]

# Kernel names of threads that never named themselves (they inherit the process's).
UNNAMED = frozenset({"python", "python3", "pt_main_thread"})
FORKSERVER = "start the workers with on_unsafe_fork='forkserver' (per loader or safeloader.configure)"
UNSAFE_FORK_WILL = {
    "auto": "a loader starts its workers with a forkserver if its Dataset pickles, else raises UnsafeForkError",
    "raise": "a loader raises UnsafeForkError instead of forking",
    "forkserver": "a loader starts its workers with a forkserver",
    "warn": "a loader forks with an UnsafeForkWarning",
    "ignore": "a loader forks silently",
}


def _inherited_names() -> frozenset[str]:
    """UNNAMED, and the program's name (``safeloader``, ``python3.11``), which threads that name
    themselves nothing inherit: it says nothing of their library. The kernel keeps 15 bytes."""
    program = {os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else ""), os.path.basename(sys.executable)}
    return UNNAMED | {name[:15] for name in program if name}


def _does(name: str) -> str:
    """What the hook ``name`` does, in a line ('' when it is not registered)."""
    hook = _hooks.get_hook(name)
    return hook.description if hook is not None else ""


def _hook_runs(name: str) -> bool:
    return _hooks.hook_runs(name, get_options())


def _remedy(name: str) -> str:
    """How to turn the hook ``name`` back on where it does not run ('' when there is no such hook)."""
    hook = _hooks.get_hook(name)
    if hook is None:
        return ""
    if name in get_options().disable_hooks:
        return f"remove {name!r} from safeloader.configure(disable_hooks=...) and the loader's disable_hooks"
    if not hook.enabled:
        return f"call safeloader.enable({name!r})"
    return backends.status(name) or f"drop {name!r} from the loader's disable_hooks"


def thread_libraries(tids: Iterable[int]) -> dict[int, list[str]]:
    """Libraries on each of this process's native threads' stacks (innermost first); empty without
    the C extension, or in a DataLoader worker (whose native-stack signal is the watchdog's)."""
    from .. import watchdog

    return {} if watchdog.in_watched_worker() else stacks.own_thread_libraries(tids)


def _classify(libraries: list[str], waits_in: str | None, name: str = "") -> tuple[str, str | None]:
    """(how reports name the library owning a thread, its shared object), from the libraries on
    its stack and the one it waits in (``native_libraries.classify``)."""
    known, package, path = native_libraries.classify([*libraries, *([waits_in] if waits_in else [])])
    if known is not None:
        return known.label or package, path
    if name.startswith("jemalloc_bg_thd"):  # they block signals: no stack, only libc's futex wait
        return "jemalloc (background threads)", None
    if path is None:
        return "unknown library", None
    return _runtime_owner(path) or os.path.basename(path), path


def _runtime_owner(path: str) -> str | None:
    """ "polars' rayon pool and tokio runtime" for a library that links such runtimes (any Rust extension)."""
    from ..diagnostics import native_pools

    kinds = native_pools.runtimes(path)
    return native_pools.describe(path, kinds) if kinds else None


class _Found:
    """The hazards found so far, as ``doctor`` reports them."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, kind: str, subject: str, what: str, status: str, by: str = "", remedy: str = "") -> None:
        self.items.append(
            {
                "kind": kind,
                "subject": subject,
                "what": what,
                "status": status,
                "handled": status in ("handled", "harmless"),
                "handled_by": by,
                "remedy": remedy,
                "safeloader_will": by if status == "handled" else remedy or by,
            }
        )

    def judge(self, hazard: Hazard, backend: str) -> None:
        """Add ``hazard`` (reported by ``backend``): handled where its hook runs or it is safe alone, else it breaks."""
        hook = backend if hazard.hook == "" else hazard.hook
        if hook is not None and _hook_runs(hook):
            does = hazard.does or _does(hook)
            by = f"hook {hook!r} ({does}), and {hazard.alone}" if hazard.alone else f"hook {hook!r}: {does}"
            self.add(hazard.kind, hazard.subject, hazard.what, "handled", by)
        elif hazard.alone:
            self.add(hazard.kind, hazard.subject, hazard.what, "handled", hazard.alone)
        else:
            enable = _remedy(hook) if hook is not None else ""
            remedy = f"{enable}, or {hazard.otherwise}" if enable and hazard.otherwise else enable or hazard.otherwise
            self.add(hazard.kind, hazard.subject, hazard.what, "breaks", remedy=remedy)


def hazards(state: forkstate.ForkState) -> list[dict[str, Any]]:
    """Everything live at fork, each with its status: "handled" (by the hook in ``handled_by``),
    "breaks" (with a ``remedy``), "unknown" (native threads of a library no backend knows) or
    "harmless" (nothing a worker inherits is broken by it)."""
    found = _Found()
    _native_threads(state, found)
    _used_runtimes(found)
    claimed = _backend_hazards(found)
    _other_python_threads(claimed, found)
    return found.items


def _native_threads(state: forkstate.ForkState, found: _Found) -> None:
    """The native threads, one item per library that owns some."""
    options = get_options()
    libraries = thread_libraries(t.tid for t in state.native_threads)
    if not libraries and state.native_threads:  # no native stacks (no C extension): where each thread started
        from ..diagnostics import thread_owners

        started = thread_owners.owners(tuple((t.tid, t.name) for t in state.native_threads))
        libraries = {tid: [library] for tid, library in started.items() if library is not None}
    groups: dict[str, list[forkstate.ForeignThread]] = {}
    paths: dict[str, str] = {}  # each owner's shared object, for the table of native libraries
    for thread in state.native_threads:
        owner, path = _classify(libraries.get(thread.tid, []), thread.library, thread.name)
        groups.setdefault(owner, []).append(thread)
        if path is not None:
            paths.setdefault(owner, path)
    for owner, threads in sorted(groups.items()):
        known = native_libraries.known(paths[owner]) if owner in paths else None
        if known is not None and known.fork == native_libraries.SURVIVES:
            found.add("native threads", owner, f"{len(threads)} native thread(s) of {owner}", "harmless", known.by)
            continue
        tids = [t.tid for t in threads]
        names = sorted({t.name for t in threads} - _inherited_names())
        listed = (
            f"(tids {', '.join(map(str, tids[:8]))}{', ...' if len(tids) > 8 else ''}"
            f"{'; named ' + ', '.join(names[:8]) if names else ''})"
        )
        what = f"{len(tids)} native thread(s) of {owner} {listed}"
        if known is not None and known.fork == native_libraries.HANDLED:
            hazard = f" {known.hazard}" if known.hazard else ""
            if _hook_runs(known.by) or not known.alone:
                alternative = f"{known.remedy}, or {FORKSERVER}" if known.remedy else FORKSERVER
                what = f"{owner}: {len(tids)} native thread(s) {listed}.{hazard}"
                found.judge(Hazard("pool", owner, what, otherwise=alternative), known.by)
            else:  # fork-safe by itself: its backend only limits it
                found.add(
                    "pool",
                    owner,
                    f"{owner}: {len(tids)} native thread(s) {listed}. Fork-safe ({known.alone}), but every "
                    "worker would use all cores",
                    "harmless",
                    f"{owner}: {known.alone}; to cap each worker's threads, " + _remedy(known.by),
                )
        elif owner.startswith("jemalloc"):
            found.add(
                "native threads",
                owner,
                f"jemalloc's background threads: {what}",
                "harmless",
                "jemalloc's own fork handlers (pthread_atfork): a worker's allocator is consistent and starts "
                "its own background threads",
            )
        elif known is not None and known.fork in (native_libraries.ABORTS, native_libraries.HANGS):
            remedy = f"its own setting: {known.remedy}, or " if known.remedy else ""
            found.add("pool", owner, f"{what}: {known.by}", "breaks", remedy=remedy + FORKSERVER)
        else:
            found.add(
                "native threads",
                owner,
                f"{what}: a pool they serve is inherited without them",
                "unknown",
                remedy=f"no backend knows {owner}: with on_unsafe_fork={options.on_unsafe_fork!r} "
                + UNSAFE_FORK_WILL.get(options.on_unsafe_fork, "")
                + f"; a worker waiting in it is named within seconds (stall_timeout={options.stall_timeout})",
            )


def _used_runtimes(found: _Found) -> None:
    """Pools on another library's threads (numba's on OpenMP's), known from the library's state."""
    for path in native_libraries.used_runtimes():
        known = native_libraries.known(path)
        if known is not None and known.fork in (native_libraries.ABORTS, native_libraries.HANGS):
            owner = f"{native_libraries.package_of(path)} ({os.path.basename(path)})"
            remedy = f"its own setting: {known.remedy}, or " if known.remedy else ""
            what = f"{owner} was used in this process: {known.by}"
            found.add("pool", owner, what, "breaks", remedy=remedy + FORKSERVER)


def _backend_hazards(found: _Found) -> set[int]:
    """What each registered backend reports (``Backend.hazards``); the Python threads it accounts for."""
    claimed: set[int] = set()
    for backend in backends.registered():
        try:
            reported = list(backend.hazards())
            wrong = next((item for item in reported if not isinstance(item, Hazard)), None)
            if wrong is not None:
                raise TypeError(f"it must yield safeloader.Hazard, got {wrong!r}")
        except Exception as error:  # one backend's bug hides only what it would report
            found.add(
                "backend",
                backend.name,
                f"backend {backend.name!r} could not say what is live ({type(error).__name__}: {error})",
                "unknown",
                remedy=f"fix {type(backend).__name__}.hazards()",
            )
            continue
        for hazard in reported:
            found.judge(hazard, backend.name)
            claimed.update(hazard.threads)
    return claimed


def _other_python_threads(claimed: set[int], found: _Found) -> None:
    me = threading.current_thread()
    unknown = [t.name for t in threading.enumerate() if t is not me and t.is_alive() and t.ident not in claimed]
    if unknown:
        options = get_options()
        found.add(
            "python threads",
            "Python threads",
            f"{len(unknown)} other Python thread(s): {', '.join(unknown[:10])}. Not a hazard by itself: only a "
            "lock one holds at the fork that a worker then needs would stay held there",
            "harmless",
            f"nothing to do unless they hold such a lock; then the stall watchdog names the stuck worker and frame "
            f"(stall_timeout={options.stall_timeout})",
        )


def summary(hazards: list[dict[str, Any]]) -> str:
    """The report's last line: what to do, in one line."""
    problems = [h for h in hazards if h["status"] == "breaks"]
    if problems:
        return f"{len(problems)} problem(s): " + "; ".join(f"{h['subject']} -> {h['remedy']}" for h in problems)
    unknown = [h for h in hazards if h["status"] == "unknown"]
    if unknown:
        return (
            "Nothing known to break: every live state safeloader recognises is handled; unknown to it: "
            + ", ".join(h["subject"] for h in unknown)
            + f" ({UNSAFE_FORK_WILL.get(get_options().on_unsafe_fork, 'see on_unsafe_fork')})."
        )
    if any(h["status"] == "handled" for h in hazards):
        return "Nothing to do: everything live in this process is handled at fork (by the hook named for each)."
    return "Nothing to do: nothing live in this process is unsafe at fork."
