"""Why a stalled worker is stuck: the likely cause its stacks show (a library's words, a native pool
inherited without its threads, a lock another parent thread held at the fork), and its remedy."""

from __future__ import annotations

import os
import re
from typing import Protocol

from .. import _hooks, hook_names
from . import certain_causes, native_libraries, stacks
from .certain_causes import short_library
from .stacks import NativeThread, PythonThread


class WatchedLoader(Protocol):
    """What the report needs to know of the loader's watch (``watchdog.Watch``)."""

    stall_timeout: float
    first_limit: float
    disabled_hooks: frozenset[str]
    parent_threads: tuple[str, ...]


class WorkerStacks(Protocol):
    """What a cause is read from: a stalled worker's stacks as collected (``stall_report.StallReport``)."""

    @property
    def pid(self) -> int: ...
    @property
    def python_threads(self) -> list[PythonThread]: ...
    @property
    def native_threads(self) -> list[NativeThread]: ...
    @property
    def native_available(self) -> bool: ...
    @property
    def waits_in(self) -> str | None: ...
    @property
    def stack_objects(self) -> tuple[str, ...]: ...
    @property
    def main_thread(self) -> PythonThread | None: ...


def _hook_state(name: str, watch: WatchedLoader) -> str:
    """Why the safeloader backend ``name`` did not prevent this."""
    hook = _hooks.get_hook(name)
    if hook is None:
        return f"this safeloader has no {name!r} backend registered"
    if name in watch.disabled_hooks:
        return f"safeloader's {name!r} backend is disabled for this loader: remove {name!r} from disable_hooks"
    if not hook.enabled:
        return f"safeloader's {name!r} backend is disabled (safeloader.disable); call safeloader.enable({name!r})"
    return f"safeloader's {name!r} backend was active: please report this stack as a safeloader bug"


def _libraries(report: WorkerStacks) -> set[str]:
    return {lib for thread in report.native_threads for lib, _ in thread.frames} | set(report.stack_objects)


def is_library_code(file: str) -> bool:
    """Whether ``file`` is the standard library's or an installed package's (not the program's own);
    a frozen module's name is not a file."""
    return not file.startswith("<frozen ") and stacks.library_file(file)


def _symbols(report: WorkerStacks) -> list[str]:
    return [symbol for thread in report.native_threads for _, symbol in thread.frames]


def _python_files(report: WorkerStacks) -> list[str]:
    return [f for thread in report.python_threads for f, _, _ in thread.frames]


def _known_library(libraries: set[str], symbols: list[str], files: list[str]) -> native_libraries.Known | None:
    """The library with words for a stall (a backend's ``Library.stall``) that the worker's stacks
    are in: its native libraries, the packages of its Python frames, GNU OpenMP's symbols (a libgomp
    without its file name). The first in the table's order when several are."""
    paths = [*libraries, *(file for file in files if is_library_code(file))]
    if any(symbol.lower().startswith("gomp") for symbol in symbols):
        paths.append("libgomp.so")
    return native_libraries.classify(paths, lambda known: bool(known.stall), table_order=True)[0]


def likely_cause(report: WorkerStacks, watch: WatchedLoader) -> str:
    """The likely cause of the stall and its fix, in words (``StallReport.cause``)."""
    libraries, symbols, files = _libraries(report), _symbols(report), _python_files(report)
    main_files = [f for f, _, _ in (report.main_thread.frames if report.main_thread else [])]
    known = _known_library(libraries, symbols, files)
    if known is not None:
        fix = _hook_state(known.by, watch) + (f", or {known.remedy}" if known.remedy else "")
        return f"{known.label}: {known.stall} Fix: {fix}."
    main_native = next((t for t in report.native_threads if t.tid == report.pid), None)
    pool = native_pool_cause(main_native, watch)
    if pool is None and not (main_native is not None and main_native.frames):
        # No native stack (no C extension): where the watchdog saw it wait, or what its stack points into.
        waits_in = report.waits_in or next(iter(report.stack_objects), None)
        pool = _pool_cause(waits_in, [], watch) if waits_in is not None else None
    if pool is not None:
        return pool
    main_symbols = [symbol for _, symbol in main_native.frames] if main_native else []
    in_futex = main_native is not None and "futex" in main_native.kernel_wait
    if _in_torch_random(main_files, main_symbols, frames_suffice=not report.native_available and in_futex):
        return (
            "torch's random generator lock: the worker's main thread waits for the lock of torch's default CPU "
            "generator (torch.manual_seed or a random op). Another thread of the parent was inside a CPU random op "
            "(which holds that lock with the GIL released) at the moment of the fork, so the lock stays held "
            f"forever in the worker. Fix: {_hook_state(hook_names.TORCH, watch)} (it makes that lock new in each "
            "worker), or keep other threads from drawing random numbers on the CPU while workers start."
        )
    if _in_numpy_random(main_native, main_symbols) or (in_futex and _numpy_random_on_stack(report)):
        return (
            "numpy's global random generator lock: the worker's main thread waits for the lock of numpy's global "
            "RandomState (np.random.seed, which torch's worker loop calls, or an np.random.* draw). Another thread "
            "of the parent was drawing from it (np.random.* holds that lock with the GIL released) at the moment "
            f"of the fork, so the lock stays held forever in the worker. Fix: {_hook_state(hook_names.TORCH, watch)} "
            "(it gives numpy's global generator a new lock in each worker before torch seeds it), or give that "
            "thread a generator of its own (np.random.default_rng())."
        )
    if _in_dynamic_loader(main_native, main_symbols):
        return (
            "glibc's dynamic-loader lock: the worker's main thread waits in dlopen (loading a shared library, "
            "e.g. importing an extension module or ctypes.CDLL). Another thread of the parent was inside the "
            "dynamic loader (dlopen, dladdr, dl_iterate_phdr) at the moment of the fork, so the loader's lock "
            "stays held forever in the worker. "
            "Fix: do not load libraries or walk them (ctypes, threadpoolctl) in other threads while workers start, "
            "or import what the workers need before starting the loader."
        )
    if main_symbols and main_symbols[0].startswith("__lll_lock_wait_private"):
        others = ", ".join(watch.parent_threads) or "none Python started"
        return (
            "a lock of the C library's own: the worker's main thread waits for one of glibc's internal locks "
            "(__lll_lock_wait_private: its environment's, its locale's...; the lock of its list of exit handlers, "
            "which the first use of a C++ static takes, safeloader's C extension releases in each worker where it "
            "finds it: safeloader.native.exit_handler_lock()). Another thread of the parent was inside the C "
            "library holding it at the moment of the fork, and glibc makes only some of its locks new in a fork's "
            f"child, so it stays held forever in the worker. Other threads of the parent at fork: {others}. Fix: "
            "start the workers before other threads run native code (loaders started from several threads at once: "
            "start one first), or start them with a forkserver (multiprocessing_context='forkserver')."
        )
    in_lock = (
        any("PyThread_acquire_lock" in s or "sem_wait" in s or "sem_clockwait" in s for s in main_symbols)
        or (bool(main_files) and (main_files[0].endswith("threading.py") or _waits_on_lock(report)))
        or (not report.native_available and in_futex)  # without native stacks, the kernel's word for it
    )
    if in_lock:
        others = ", ".join(watch.parent_threads) or "none"
        return (
            "a lock that is never released: the worker's main thread waits to acquire a lock. A lock held by "
            "another thread of the parent when the workers were forked stays held forever in every worker "
            f"(that thread does not exist there). Other threads of the parent at fork: {others}. "
            "Fix: do not hold locks while workers start, or re-create the lock in the worker "
            "(safeloader.register_at_fork(after_in_child=...))."
        )
    kernel = f" The main thread waits in the kernel in {main_native.kernel_wait}." if main_native else ""
    return (
        "unknown: no known pool or lock in the stacks. A native library's thread pool or lock inherited across "
        f"fork, or a blocking I/O call, are the usual suspects: look at the stacks below.{kernel}"
    )


def native_pool_cause(main: NativeThread | None, watch: WatchedLoader) -> str | None:
    """A worker whose main thread waits inside a library that runs a rayon pool or a tokio runtime,
    named from the library the frames lie in (stripped Rust shows no names) and the parent's live pool."""
    if main is None or not main.frames:
        return None
    library = next((lib for lib, _ in main.frames if not any(s in lib for s in stacks.SYSTEM_LIBRARIES)), None)
    if library is None:
        return None
    return _pool_cause(library, [symbol for lib, symbol in main.frames if lib == library], watch)


def _pool_cause(library: str, symbols: list[str], watch: WatchedLoader) -> str | None:
    """The worker waits in ``library`` (its frames there named by ``symbols``, where known)."""
    from . import native_pools

    kinds = native_pools.runtimes_in_symbols(symbols) or native_pools.runtimes(library)
    if not kinds:
        return certain_causes.lacking_threads(library)
    owner = native_pools.owner(library)
    what = native_pools.describe(library, kinds[:1])
    also = f" (it also runs a {', '.join(kinds[1:])}, inherited the same way)" if kinds[1:] else ""
    fix = (
        _hook_state(owner, watch)
        if _hooks.get_hook(owner) is not None
        else f"no safeloader backend resets {owner}'s pools: pass on_unsafe_fork='forkserver' to the loader "
        "(or safeloader.configure(on_unsafe_fork='forkserver')), or do not use the library in the parent "
        "before the workers start"
    )
    return (
        f"{what}, inherited without its threads: the worker waits in {short_library(library)} ({owner}), which "
        f"runs a {kinds[0]}{also}. The parent started it before the fork (its threads: "
        f"{_parent_thread_names() or 'none named'}); a forked child has the pool's bookkeeping but none of its "
        f"threads, so the job it queued never runs. Fix: {fix}."
    )


def _parent_thread_names() -> str:
    """This process's thread names other than Python's own, counted (``polars-0 x1, tokio-rt-worker x2``)."""
    counts: dict[str, int] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return ""
    for tid in tids:
        name = stacks.read_proc(f"/proc/self/task/{tid}/comm")
        if name and name not in ("python", "python3", "pt_main_thread"):
            counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{name} x{count}" for name, count in sorted(counts.items()))


def _in_torch_random(main_files: list[str], main_symbols: list[str], frames_suffice: bool = False) -> bool:
    """Whether the main thread waits on a mutex inside torch's random module (manual_seed, seed);
    with ``frames_suffice`` (no native stack, a futex wait) its Python frames alone say so."""
    in_random = any(f.endswith(os.path.join("torch", "random.py")) for f in main_files[:3])
    return in_random and (frames_suffice or any(symbol.startswith("pthread_mutex_lock") for symbol in main_symbols))


def _in_numpy_random(main: NativeThread | None, main_symbols: list[str]) -> bool:
    """Whether the main thread waits on a Python lock inside numpy.random (its global RandomState's)."""
    if main is None or not any("PyThread_acquire_lock" in symbol for symbol in main_symbols):
        return False
    return any(os.path.join("numpy", "random") in library for library, _ in main.frames[:12])


def _numpy_random_on_stack(report: WorkerStacks) -> bool:
    """Without native stacks: whether numpy.random's code is on the main thread's stack."""
    return any(os.path.join("numpy", "random") in name for name in report.stack_objects[:12])


_LOADER_SYMBOLS = ("dlopen", "dl_open", "dl_catch", "dl_map_object", "libc_dlopen", "dl_open_worker")


def _in_dynamic_loader(main: NativeThread | None, symbols: list[str]) -> bool:
    """Whether the main thread waits inside glibc's dynamic loader (a lock wait in dlopen)."""
    if main is None:
        return False
    if any(symbol.lstrip("_").startswith(_LOADER_SYMBOLS) for symbol in symbols):
        return True
    return any("ld-linux" in library for library, _ in main.frames[:3])


def _waits_on_lock(report: WorkerStacks) -> bool:
    thread = report.main_thread
    if thread is None or not thread.frames:
        return False
    file, line, _ = thread.frames[0]
    try:
        import linecache

        source = linecache.getline(file, line)
    except Exception:
        return False
    return ".acquire(" in source or re.search(r"\bwith\b.*lock", source, re.IGNORECASE) is not None
