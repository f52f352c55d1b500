"""``safeloader doctor``: what would happen if this process started DataLoader workers now.

How it works and why: docs/internals.md, ``safeloader.doctor``.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import json as json_module
import os
import platform
import sys
import threading
import time
from collections.abc import Iterable
from typing import IO, Any

from . import _hooks as hook_registry
from . import _torch_internals, backends, forkstate, native
from ._options import get_options
from .diagnostics import native_libraries, stacks
from .hook_names import FILES, H5PY, PIN_MEMORY, TORCH

__all__ = ["collect", "doctor", "format_report"]

DISTRIBUTIONS = ("torch-safeloader", "torch", "numpy", "zarr", "zarrs", "h5py", "threadpoolctl")
# Kernel names of threads that never named themselves (they inherit the process's).
UNNAMED = frozenset({"python", "python3", "pt_main_thread"})


def _inherited_names() -> frozenset[str]:
    """UNNAMED, and the names this process's threads inherit when they name themselves nothing: the
    program's (``safeloader`` for the console script, ``python3.11``...), which says nothing of the
    library that started them. The kernel keeps 15 bytes of a name."""
    program = {os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else ""), os.path.basename(sys.executable)}
    return UNNAMED | {name[:15] for name in program if name}
# Libraries whose Python event-loop thread and executors a forked child re-creates by itself,
# from the library's own os.register_at_fork handler: (module, library/hook name, the handler).
LOOP_OWNERS = (("zarr.core.sync", "zarr", "reset_resources_after_fork"), ("fsspec.asyn", "fsspec", "reset_after_fork"))


def _does(name: str) -> str:
    """What the hook ``name`` does, in a line ('' when it is not registered)."""
    hook = hook_registry.get_hook(name)
    return hook.description if hook is not None else ""


# -- facts ---------------------------------------------------------------------------


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


def _hook_runs(name: str) -> bool:
    return hook_registry.hook_runs(name, get_options())


def thread_libraries(tids: Iterable[int]) -> dict[int, list[str]]:
    """Libraries on each of this process's native threads' stacks (innermost first).

    Empty without the C extension, or inside a DataLoader worker (whose
    handler on the native-stack signal belongs to the stall watchdog).
    """
    from . import watchdog

    return {} if watchdog.in_watched_worker() else stacks.own_thread_libraries(tids)


def _classify(libraries: list[str], waits_in: str | None, name: str = "") -> tuple[str, str | None]:
    """(how reports name the library owning a thread, its shared object) from the libraries on the
    thread's stack and the one it waits in: the first with an entry in ``native_libraries``."""
    everything = [*libraries, *([waits_in] if waits_in else [])]
    for path in everything:
        known, package = native_libraries.entry(path)
        if known is not None:
            return known.label or package, path
    if name.startswith("jemalloc_bg_thd"):  # they block signals: no stack, only libc's futex wait
        return "jemalloc (background threads)", None
    owner = next(iter(everything), None)
    if owner is None:
        return "unknown library", None
    return _runtime_owner(owner) or os.path.basename(owner), owner


def _runtime_owner(path: str) -> str | None:
    """ "polars' rayon pool and tokio runtime" for a library that links such runtimes (any Rust extension)."""
    from .diagnostics import native_pools

    kinds = native_pools.runtimes(path)
    return native_pools.describe(path, kinds) if kinds else None


def _open_h5py_files() -> list[dict[str, Any]]:
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return []
    files = []
    try:
        ids = h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)
    except Exception:  # h5py internals differ: report nothing rather than fail the doctor
        return []
    for file_id in ids:
        try:
            name = file_id.name.decode() if isinstance(file_id.name, bytes) else str(file_id.name)
            writable = file_id.get_intent() != h5py.h5f.ACC_RDONLY
        except Exception:
            continue
        files.append({"path": name, "mode": "r+" if writable else "r"})
    return files


def _open_npz_archives() -> list[str]:
    numpy = sys.modules.get("numpy")
    npz_type = getattr(getattr(getattr(numpy, "lib", None), "npyio", None), "NpzFile", None)
    if npz_type is None:
        return []
    found = []
    for obj in gc.get_objects():
        # type(), not isinstance(): some objects (NpzFile.f) fail every attribute lookup.
        if issubclass(type(obj), npz_type) and getattr(obj, "zip", None) is not None:
            found.append(str(getattr(obj.fid, "name", None) or getattr(obj.zip, "filename", None) or "<file object>"))
    return found


def _remedy(name: str) -> str:
    """How to turn the hook ``name`` back on where it does not run ('' when there is no such hook)."""
    hook = hook_registry.get_hook(name)
    if hook is None:
        return ""
    if name in get_options().disable_hooks:
        return f"remove {name!r} from safeloader.configure(disable_hooks=...) and the loader's disable_hooks"
    if not hook.enabled:
        return f"call safeloader.enable({name!r})"
    return backends.status(name) or f"drop {name!r} from the loader's disable_hooks"


def _loop_threads() -> dict[int, tuple[str, str]]:
    """Python threads of the event loops and executors of libraries that re-create them in a
    forked child themselves: ident -> (library, who handles them)."""
    found: dict[int, tuple[str, str]] = {}
    for module_name, library, reset in LOOP_OWNERS:
        module = sys.modules.get(module_name)
        if module is None or not callable(getattr(module, reset, None)):
            continue  # a version without its own at-fork reset: its threads stay unexplained
        threads: list[Any] = [*(getattr(module, "iothread", None) or [])]
        executors = [getattr(module, "_executor", None)]
        loop = (getattr(module, "loop", None) or [None])[0]
        executors.append(getattr(loop, "_default_executor", None))
        for executor in executors:
            threads += list(getattr(executor, "_threads", None) or ())
        hook = library if _hook_runs(library) else None
        by = (
            f"hook {hook!r} ({_does(hook)}), and {library}'s own fork handler ({module_name}.{reset})"
            if hook
            else f"{library}'s own fork handler ({module_name}.{reset}): a worker starts its own event loop and "
            "threads on first use"
        )
        for thread in threads:
            if thread is not None and thread.ident is not None:
                found[thread.ident] = (library, by)
    return found


def _pin_memory_thread(thread: threading.Thread) -> bool:
    target = getattr(thread, "_target", None)
    return getattr(target, "__name__", "") == "_pin_memory_loop"


_UNSAFE_FORK_WILL = {
    "auto": "a loader starts its workers with a forkserver if its Dataset pickles, else raises UnsafeForkError",
    "raise": "a loader raises UnsafeForkError instead of forking",
    "forkserver": "a loader starts its workers with a forkserver",
    "warn": "a loader forks with an UnsafeForkWarning",
    "ignore": "a loader forks silently",
}


def _hazards(state: forkstate.ForkState) -> list[dict[str, Any]]:
    """Everything live at fork, each with its status: "handled" (by the hook in ``handled_by``),
    "breaks" (with a ``remedy``), "unknown" (native threads of a library no backend knows) or
    "harmless" (nothing a worker inherits is broken by it)."""
    hazards: list[dict[str, Any]] = []
    options = get_options()

    def add(kind: str, subject: str, what: str, status: str, by: str = "", remedy: str = "") -> None:
        hazards.append(
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

    def hook_or_break(kind: str, subject: str, what: str, hook: str, does: str, alternative: str) -> None:
        if _hook_runs(hook):
            add(kind, subject, what, "handled", f"hook {hook!r}: {does}")
        else:
            enable = _remedy(hook)
            add(kind, subject, what, "breaks", remedy=f"{enable}, or {alternative}" if enable else alternative)

    forkserver = "start the workers with on_unsafe_fork='forkserver' (per loader or safeloader.configure)"
    libraries = thread_libraries(t.tid for t in state.native_threads)
    if not libraries and state.native_threads:  # no native stacks (no C extension): where each thread started
        from .diagnostics import thread_owners

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
            add("native threads", owner, f"{len(threads)} native thread(s) of {owner}", "harmless", known.by)
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
                alternative = f"{known.remedy}, or {forkserver}" if known.remedy else forkserver
                what = f"{owner}: {len(tids)} native thread(s) {listed}.{hazard}"
                hook_or_break("pool", owner, what, known.by, _does(known.by), alternative)
            else:  # fork-safe by itself: its backend only limits it
                add(
                    "pool",
                    owner,
                    f"{owner}: {len(tids)} native thread(s) {listed}. Fork-safe ({known.alone}), but every "
                    "worker would use all cores",
                    "harmless",
                    f"{owner}: {known.alone}; to cap each worker's threads, " + _remedy(known.by),
                )
        elif owner.startswith("jemalloc"):
            add(
                "native threads",
                owner,
                f"jemalloc's background threads: {what}",
                "harmless",
                "jemalloc's own fork handlers (pthread_atfork): a worker's allocator is consistent and starts "
                "its own background threads",
            )
        else:
            if known is not None and known.fork in (native_libraries.ABORTS, native_libraries.HANGS):
                remedy = f"its own setting: {known.remedy}, or " if known.remedy else ""
                add("pool", owner, f"{what}: {known.by}", "breaks", remedy=remedy + forkserver)
            else:
                add(
                    "native threads",
                    owner,
                    f"{what}: a pool they serve is inherited without them",
                    "unknown",
                    remedy=f"no backend knows {owner}: with on_unsafe_fork={options.on_unsafe_fork!r} "
                    + _UNSAFE_FORK_WILL.get(options.on_unsafe_fork, "")
                    + f"; a worker waiting in it is named within seconds (stall_timeout={options.stall_timeout})",
                )
    for path in native_libraries.used_runtimes():  # pools on another library's threads (numba's on OpenMP's)
        known = native_libraries.known(path)
        if known is not None and known.fork in (native_libraries.ABORTS, native_libraries.HANGS):
            owner = f"{native_libraries.package_of(path)} ({os.path.basename(path)})"
            remedy = f"its own setting: {known.remedy}, or " if known.remedy else ""
            add("pool", owner, f"{owner} was used in this process: {known.by}", "breaks", remedy=remedy + forkserver)
    for entry in _open_h5py_files():
        writable = entry["mode"] != "r"
        what = f"open h5py file {entry['path']} (mode {entry['mode']!r}): workers would share the parent's HDF5 handle"
        if writable:
            hook_or_break("open file", "h5py", what, H5PY, _does(H5PY), "close the file before the loader starts")
        else:
            hook_or_break(
                "open file",
                "h5py",
                what,
                FILES,
                "each worker reads it through its own file offset",
                "open the file in the worker",
            )
    for path in _open_npz_archives():
        hook_or_break(
            "open file",
            "numpy npz",
            f"open npz archive {path}: workers would share one file offset (BadZipFile, wrong data)",
            FILES,
            "each worker reads the archive through its own file offset",
            "open the archive in the worker",
        )
    for name in state.accelerators:
        hook_or_break(
            "accelerator",
            f"torch.{name}",
            f"torch.{name} is initialised: a forked worker cannot use it",
            TORCH,
            f"a worker that touches {name} raises a clear error (the parent may keep using it)",
            f"do not use {name} in workers",
        )
    me = threading.current_thread()
    owned = _loop_threads()
    by_library: dict[str, tuple[str, list[str]]] = {}
    unknown = []
    for python_thread in threading.enumerate():
        if python_thread is me or not python_thread.is_alive():
            continue
        library, by = owned.get(python_thread.ident or 0, ("", ""))
        if library:
            by_library.setdefault(library, (by, []))[1].append(python_thread.name)
        elif _pin_memory_thread(python_thread):
            hook_or_break(
                "python thread",
                "pin_memory",
                f"Python thread {python_thread.name} (a DataLoader's pin-memory thread)",
                PIN_MEMORY,
                _does(PIN_MEMORY),
                "start loaders one after the other",
            )
        else:
            unknown.append(python_thread.name)
    for library, (by, names) in sorted(by_library.items()):
        add(
            "python threads",
            library,
            f"{len(names)} Python thread(s) of {library}'s event loop and its executor: {', '.join(names[:10])}",
            "handled",
            by,
        )
    if unknown:
        add(
            "python threads",
            "Python threads",
            f"{len(unknown)} other Python thread(s): {', '.join(unknown[:10])}. Not a hazard by itself: only a "
            "lock one holds at the fork that a worker then needs would stay held there",
            "harmless",
            f"nothing to do unless they hold such a lock; then the stall watchdog names the stuck worker and frame "
            f"(stall_timeout={options.stall_timeout})",
        )
    return hazards


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
            + f" ({_UNSAFE_FORK_WILL.get(get_options().on_unsafe_fork, 'see on_unsafe_fork')})."
        )
    if any(h["status"] == "handled" for h in hazards):
        return "Nothing to do: everything live in this process is handled at fork (by the hook named for each)."
    return "Nothing to do: nothing live in this process is unsafe at fork."


_UNKNOWN_RETRIES = 2
_UNKNOWN_PAUSE = 0.05


def collect(imports: Iterable[str] = ()) -> dict[str, Any]:
    """The doctor's findings as plain data (what ``--json`` prints). Imports ``imports`` first."""
    for name in imports:
        importlib.import_module(name)
    import torch.utils.data  # noqa: F401  (hooks that require torch are listed as a loader sees them)

    # A thread a pool has just started may not have reached its library's code yet (none of it on
    # its stack, not waiting in it): looked at again, twice, 50 ms apart, before it is called unknown.
    for attempt in range(_UNKNOWN_RETRIES + 1):
        state = forkstate.snapshot(pools=True)
        hazards = _hazards(state)
        if attempt == _UNKNOWN_RETRIES or not any(h["status"] == "unknown" for h in hazards):
            break
        time.sleep(_UNKNOWN_PAUSE)
    options = get_options()
    return {
        "versions": _versions(),
        "start_method": _start_method(),
        "options": options.as_dict(),
        "hooks": _hooks(),
        "live_at_fork": hazards,
        "summary": summary(hazards),
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


# -- output --------------------------------------------------------------------------


def format_report(report: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = ["safeloader doctor", "", "Versions:"]
    for name, version in report["versions"].items():
        lines.append(f"  {name:<18} {version or 'not installed'}")
    start = report["start_method"]
    lines += [
        "",
        f"Start method: workers will be started with {start['safeloader']!r} ({start['why']}; "
        f"torch's default here: {start['torch_default']!r}).",
    ]
    if not start["hooks_run"]:
        lines.append("  Fork hooks do not run with this start method; the Dataset is pickled into each worker.")
    options = report["options"]
    lines.append(
        "Options: "
        + ", ".join(f"{k}={v!r}" for k, v in options.items() if k != "disable_hooks")
        + (f", disable_hooks={options['disable_hooks']}" if options["disable_hooks"] else "")
    )
    lines += ["", "Fork hooks and backends (in run order):"]
    for hook in report["hooks"]:
        mark = "on " if hook["active"] else "off"
        lines.append(f"  [{mark}] {hook['name']:<20} {hook['state']}")
        lines.append(f"        {hook['does']}")
    hazards = report["live_at_fork"]
    sections = (
        ("handled", "Handled at fork (the hook that handles each):", "ok  ", "handled by"),
        ("harmless", "Live, but safe at fork by itself:", "ok  ", "why"),
        ("breaks", "Will break in forked workers:", "WARN", "remedy"),
        ("unknown", "Not known to safeloader (may or may not break):", "??  ", "if it does"),
    )
    if not hazards:
        lines += ["", "Live at fork: nothing (no native threads, pools, open HDF5/npz files, CUDA or other threads)."]
    for status, heading, mark, label in sections:
        items = [h for h in hazards if h["status"] == status]
        if items:
            lines += ["", heading]
        for hazard in items:
            lines.append(f"  [{mark}] {hazard['what']}")
            lines.append(
                f"         {label}: {hazard['handled_by'] if status in ('handled', 'harmless') else hazard['remedy']}"
            )
    pools = report["process"]["pools"]
    if pools:
        lines += ["", "Thread pools configured (threadpoolctl; only live ones are listed above):"]
        lines += [f"  {p['library']} ({p['api']}): {p['threads']} thread(s), {p['path']}" for p in pools]
    notes = report["process"]["notes"]
    if notes:
        lines += ["", "Notes:"] + [f"  {note}" for note in notes]
    lines += ["", report["summary"]]
    return "\n".join(lines)


def doctor(*, imports: Iterable[str] = (), json: bool = False, file: IO[str] | None = sys.stdout) -> dict[str, Any]:
    """Print what safeloader sees in this process and what it will do; return the same as a dict.

    ``imports``: modules to import first. ``json=True`` prints JSON.
    ``file=None`` prints nothing.
    """
    report = collect(imports)
    if file is not None:
        text = json_module.dumps(report, indent=2) if json else format_report(report)
        try:
            print(text, file=file)
        except BrokenPipeError:  # piped into head & co.
            pass
    return report


class _CallableModule(type(sys)):  # type: ignore[misc]
    # ``safeloader.doctor`` is this module once it is imported (the import
    # system binds submodules on the package); keep ``safeloader.doctor()``
    # working either way.
    def __call__(self, **kwargs: Any) -> dict[str, Any]:
        return doctor(**kwargs)


sys.modules[__name__].__class__ = _CallableModule
