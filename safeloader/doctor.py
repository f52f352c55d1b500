"""``safeloader doctor``: what would happen if this process started DataLoader workers now.

Reports the versions, the start method workers will use, every registered
fork hook (built-in backends included) and whether it is active, what is live
in this process that a forked worker inherits in a broken state (native
threads and the pools they belong to, open h5py files and npz archives, CUDA,
other Python threads), and what safeloader will do about each.

From the command line: ``python -m safeloader doctor [--json] [--import pkg ...]``.
From code: ``safeloader.doctor()`` prints the report and returns it as a dict;
call it where your program would create its DataLoader.
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
from collections.abc import Iterable
from typing import IO, Any

from . import _registry, _stacks, backends, forkstate, native
from ._options import get_options
from .hook_names import FILES, H5PY, THREADPOOLS, TORCH, ZARRS

__all__ = ["collect", "doctor", "format_report"]

DISTRIBUTIONS = ("torch-safeloader", "torch", "numpy", "zarr", "zarrs", "h5py", "threadpoolctl")


def _does(name: str) -> str:
    """What the hook ``name`` does, in a line ('' when it is not registered)."""
    hook = _registry.get_hook(name)
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
    return found


def _start_method() -> dict[str, Any]:
    import torch.multiprocessing

    explicit = torch.multiprocessing.get_start_method(allow_none=True)
    default = torch.multiprocessing.get_context().get_start_method()
    on_linux = sys.platform.startswith("linux")
    # The same rule as safeloader's loader (_loader.start_armed).
    safeloader_uses = "fork" if on_linux and explicit is None else default
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
    for hook in _registry.hooks():
        phases = [p for p in _registry.PHASES if getattr(hook, p) is not None]
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
                "priority": hook.priority,
                "does": hook.description or "user hook",
            }
        )
    return rows


def _hook_runs(name: str) -> bool:
    return _registry.hook_runs(name, get_options())


def _plan(name: str, active_text: str) -> str:
    if _hook_runs(name):
        return active_text
    return f"nothing: the {name!r} backend is disabled or missing; workers may hang or read wrong data"


def thread_libraries(tids: Iterable[int]) -> dict[int, list[str]]:
    """Libraries on each of this process's native threads' stacks (innermost first).

    Empty without the C extension, or inside a DataLoader worker (whose
    handler on the native-stack signal belongs to the stall watchdog).
    """
    from . import watchdog

    return {} if watchdog.in_watched_worker() else _stacks.own_thread_libraries(tids)


def _classify(libraries: list[str], waits_in: str | None) -> str:
    everything = [*libraries, *([waits_in] if waits_in else [])]
    for path in everything:
        base = os.path.basename(path).lower()
        if f"{os.sep}zarrs{os.sep}" in path:
            return "zarrs (rayon pool)"
        if base.startswith("libgomp"):
            return "GNU OpenMP (libgomp)"
        if "openblas" in base:
            return "OpenBLAS"
        if "hdf5" in base:
            return "HDF5"
        if base.startswith(("libiomp", "libomp")):
            return "LLVM/Intel OpenMP"
    owner = next(iter(everything), None)
    if owner is None:
        return "unknown library"
    return _runtime_owner(owner) or os.path.basename(owner)


def _runtime_owner(path: str) -> str | None:
    """ "polars' rayon pool and tokio runtime" for a library that links such runtimes (any Rust extension)."""
    from . import native_pools

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


def _hazards(state: forkstate.ForkState) -> list[dict[str, Any]]:
    hazards: list[dict[str, Any]] = []
    options = get_options()

    def add(kind: str, what: str, safeloader_will: str, handled: bool) -> None:
        hazards.append({"kind": kind, "what": what, "safeloader_will": safeloader_will, "handled": handled})

    libraries = thread_libraries(t.tid for t in state.native_threads)
    groups: dict[str, list[int]] = {}
    for thread in state.native_threads:
        groups.setdefault(_classify(libraries.get(thread.tid, []), thread.library), []).append(thread.tid)
    for owner, tids in sorted(groups.items()):
        what = f"{len(tids)} native thread(s) of {owner} (tids {', '.join(map(str, tids[:8]))})"
        if owner.startswith("zarrs"):
            add(
                "pool",
                f"zarrs' rayon pool is live: {what}. A forked worker inherits it without its threads: "
                "multi-chunk reads hang",
                _plan(ZARRS, _does(ZARRS) + f" ({options.zarrs_mode!r})"),
                _hook_runs(ZARRS),
            )
        elif owner.startswith("GNU OpenMP"):
            add(
                "pool",
                f"GNU OpenMP pool is live: {what}. A forked worker running a parallel region with >1 thread hangs",
                _plan(THREADPOOLS, "each worker runs GNU OpenMP with 1 thread (other pools: the thread budget)"),
                _hook_runs(THREADPOOLS),
            )
        elif owner == "OpenBLAS":
            add(
                "pool",
                f"OpenBLAS pool is live: {what}. Fork-safe, but every worker would use all cores",
                _plan(THREADPOOLS, _does(THREADPOOLS)),
                _hook_runs(THREADPOOLS),
            )
        elif owner.endswith(("rayon pool", "tokio runtime")):
            library = owner.split("'", 1)[0]
            handled = _hook_runs(library)
            names = sorted({t.name for t in state.native_threads if t.tid in tids})
            add(
                "pool",
                f"{owner} is live: {what}, named {', '.join(names[:8])}. A forked worker inherits it without "
                "its threads: its first parallel call hangs",
                _does(library)
                if handled
                else "nothing resets it; the stall watchdog names a worker that hangs on it. Start workers safely "
                "with on_unsafe_fork='forkserver' (per loader or safeloader.configure)",
                handled,
            )
        else:
            add(
                "native threads",
                f"{what}: a lock or pool they own is inherited in whatever state it was",
                "no backend knows this library; the stall watchdog names a worker that hangs on it "
                f"(stall_timeout={options.stall_timeout})",
                False,
            )
    for entry in _open_h5py_files():
        writable = entry["mode"] != "r"
        add(
            "open file",
            f"open h5py file {entry['path']} (mode {entry['mode']!r}): workers would share the parent's HDF5 handle",
            _plan(H5PY, _does(H5PY))
            if writable
            else _plan(FILES, "each worker gets its own file offset for it (the 'files' hook)"),
            _hook_runs(H5PY) if writable else _hook_runs(FILES),
        )
    for path in _open_npz_archives():
        add(
            "open file",
            f"open npz archive {path}: workers would share one file offset (BadZipFile, wrong data)",
            _plan(FILES, "each worker gets its own file offset for the archive (the 'files' hook)"),
            _hook_runs(FILES),
        )
    for name in state.accelerators:
        add(
            "accelerator",
            f"torch.{name} is initialised: a forked worker cannot use it",
            _plan(TORCH, f"a worker that touches {name} raises a clear error (the parent may keep using it)"),
            _hook_runs(TORCH),
        )
    me = threading.current_thread()
    others = [t.name for t in threading.enumerate() if t is not me and t.is_alive()]
    if others:
        add(
            "python threads",
            f"{len(others)} other Python thread(s): {', '.join(others[:10])}. A lock one of them holds at the fork "
            "stays held forever in workers",
            "nothing can release such a lock; the stall watchdog names the stuck worker and frame "
            f"(stall_timeout={options.stall_timeout})",
            False,
        )
    return hazards


def collect(imports: Iterable[str] = ()) -> dict[str, Any]:
    """The doctor's findings as plain data (what ``--json`` prints). Imports ``imports`` first."""
    for name in imports:
        importlib.import_module(name)
    import torch.utils.data  # noqa: F401  (hooks that require torch are listed as a loader sees them)

    state = forkstate.snapshot(pools=True)
    options = get_options()
    return {
        "versions": _versions(),
        "start_method": _start_method(),
        "options": {
            "zarrs_mode": options.zarrs_mode,
            "thread_budget": options.thread_budget,
            "freeze_gc": options.freeze_gc,
            "stall_timeout": options.stall_timeout,
            "disable_hooks": sorted(options.disable_hooks),
            "on_unsafe_fork": options.on_unsafe_fork,
        },
        "hooks": _hooks(),
        "live_at_fork": _hazards(state),
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
    lines += ["", "Live in this process and unsafe at fork:"]
    if not report["live_at_fork"]:
        lines.append("  nothing: no native threads, pools, open HDF5/npz files, CUDA or other Python threads.")
    for hazard in report["live_at_fork"]:
        mark = "ok  " if hazard["handled"] else "WARN"
        lines.append(f"  [{mark}] {hazard['what']}")
        lines.append(f"         safeloader will: {hazard['safeloader_will']}")
    pools = report["process"]["pools"]
    if pools:
        lines += ["", "Thread pools configured (threadpoolctl; only live ones above are a fork hazard):"]
        lines += [f"  {p['library']} ({p['api']}): {p['threads']} thread(s), {p['path']}" for p in pools]
    notes = report["process"]["notes"]
    if notes:
        lines += ["", "Notes:"] + [f"  {note}" for note in notes]
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
