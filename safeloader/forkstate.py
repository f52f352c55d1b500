"""What is live in a process at fork time: native threads, thread pools, accelerators
(why: docs/internals.md)."""

from __future__ import annotations

import functools
import gc
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any, cast

from . import _context, _loader_lock, _torch_internals, native
from ._imports import modules_state

__all__ = [
    "ForkState", "ForeignThread", "Pool", "StartForks", "loaded_libraries", "parent_state", "record",
    "record_for_later_forks", "snapshot",
]

# Runtimes whose pool a forked child cannot use: GNU OpenMP keeps the parent's
# team in the child and waits for threads that do not exist. LLVM/Intel
# OpenMP (libomp, libiomp5) reset themselves at fork and are not listed.
_GOMP_PREFIX = "libgomp"
# Where libgomp's own code issues its futex waits (inline syscall), so an idle
# pool thread is attributable to it. Elsewhere (aarch64: via libc's syscall())
# attribution of libgomp threads is impossible and the conservative rule holds.
_GOMP_ATTRIBUTABLE = platform.machine() in ("x86_64", "AMD64", "i386", "i686")


@dataclass(frozen=True)
class ForeignThread:
    """An OS thread of this process that Python's ``threading`` did not start."""

    tid: int
    name: str
    """Kernel thread name (``/proc/self/task/<tid>/comm``); usually inherited, so rarely telling."""
    state: str
    """"blocked" (waiting in a system call), "running", or "unknown" (could not be read)."""
    library: str | None
    """Real path of the shared object whose code issued the blocking call; None unless blocked."""


@dataclass(frozen=True)
class Pool:
    """A BLAS or OpenMP thread pool, as threadpoolctl reports it."""

    user_api: str
    """"blas" or "openmp"."""
    internal_api: str
    """"openblas", "mkl", "blis", "openmp", ..."""
    filepath: str
    num_threads: int
    version: str | None


@dataclass(frozen=True)
class ForkState:
    """A process's fork-relevant state at one moment. Returned by ``snapshot()``."""

    pid: int
    fork_generation: int
    """``safeloader.native.fork_generation()`` when taken (a worker's is its parent's + 1)."""
    python_threads: tuple[tuple[int, str], ...]
    """(tid, name) of threads started by Python's ``threading``."""
    native_threads: tuple[ForeignThread, ...]
    """Threads Python did not start: native pools, runtimes, watchdogs of C libraries."""
    gomp_loaded: tuple[str, ...]
    """Real paths of the GNU OpenMP runtimes (libgomp copies) loaded in the process."""
    gomp_live: tuple[str, ...]
    """Those libgomp copies with pool threads alive: this process ran an OpenMP parallel region."""
    gomp_unsafe: tuple[str, ...]
    """libgomp copies whose pool may be live: a child forked with it must run their parallel regions
    with 1 thread (more hangs), unless the pool is released before the fork (the "threadpools"
    backend does): ``gomp_live``, or every loaded copy when some native thread could not be attributed."""
    pools: tuple[Pool, ...] | None
    """BLAS/OpenMP pools from threadpoolctl; None when not requested or threadpoolctl is not installed."""
    accelerators: tuple[str, ...]
    """Initialised torch accelerators ("cuda", "xpu"): a forked child cannot use them."""
    torch_threads: int | None
    """``torch.get_num_threads()``, if torch is imported."""
    gc_frozen: int | None
    """``gc.get_freeze_count()``: objects in the permanent generation; None when not counted
    (the per-fork record skips it: counting walks every frozen object, 25 ms for a torch process's
    whole heap)."""
    libraries: tuple[str, ...] = field(default=(), repr=False)
    """Paths of the shared objects loaded, in load order (as the dynamic linker names them)."""
    notes: tuple[str, ...] = field(default=())
    """Why some facts are missing or conservative."""

    def threads_in(self, library: str) -> tuple[ForeignThread, ...]:
        """Native threads waiting in ``library`` (a real path, as in ``ForeignThread.library``)."""
        return tuple(t for t in self.native_threads if t.library == library)

    def describe(self) -> str:
        """Human-readable lines, for diagnostics."""
        lines = [
            f"process {self.pid} (fork generation {self.fork_generation}): "
            f"{len(self.python_threads)} Python thread(s), {len(self.native_threads)} native thread(s)"
        ]
        by_library: dict[str, int] = {}
        for thread in self.native_threads:
            key = thread.library or f"unattributed ({thread.state})"
            by_library[key] = by_library.get(key, 0) + 1
        lines += [f"  {count} native thread(s) in {library}" for library, count in sorted(by_library.items())]
        for pool in self.pools or ():
            lines.append(f"  pool {pool.internal_api} ({pool.user_api}) {pool.num_threads} thread(s): {pool.filepath}")
        for path in self.gomp_unsafe:
            why = "has live pool threads" if path in self.gomp_live else "may have live pool threads"
            lines.append(f"  GNU OpenMP {path} {why}: a forked child must not run it with more than 1 thread")
        for name in self.accelerators:
            lines.append(f"  torch.{name} is initialised: a forked child cannot use {name}")
        if self.torch_threads is not None:
            lines.append(f"  torch intra-op threads: {self.torch_threads}")
        if self.gc_frozen:
            lines.append(f"  {self.gc_frozen} object(s) frozen by gc.freeze()")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


class _DynamicLinker:
    """The loader's list of loaded objects, listed again only when something was loaded or unloaded,
    each listing a ``_loader_lock.section`` (why: docs/internals.md, ``safeloader._loader_lock``)."""

    def __init__(self) -> None:
        # The last full list, with the loader's (loads, unloads) counters when it was taken.
        self._loaded: tuple[tuple[int, int] | None, tuple[str, ...]] = (None, ())
        self._gomp: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # (a list, its libgomp copies)

    def loaded(self) -> tuple[str, ...]:
        """Paths of the loaded objects, in load order. Listed again only when something
        was loaded or unloaded since the last call: a full walk costs more per fork
        in a torch process than the check."""
        counters = native.loaded_counters()
        if counters is not None and counters == self._loaded[0]:
            return self._loaded[1]
        counters, names = _loader_lock.section(functools.partial(native.loaded_objects, True))
        self._loaded = (counters, names or ())
        return self._loaded[1]

    def gomp_loaded(self, libraries: tuple[str, ...]) -> tuple[str, ...]:
        """Real paths of the libgomp copies among ``libraries``; the same tuple as last
        time (``loaded`` returns it while nothing is loaded) costs nothing."""
        if libraries is not self._gomp[0]:
            # The substring test first: a C-level scan, where basename() is a Python call per object.
            self._gomp = (libraries, tuple(sorted({os.path.realpath(p) for p in libraries
                                                   if _GOMP_PREFIX in p and _is_gomp(p)})))
        return self._gomp[1]


# One per process, as the dynamic loader is (made here: its constructor does nothing).
_linker = _DynamicLinker()


def _dynamic_linker() -> _DynamicLinker:
    return _linker


def loaded_libraries() -> tuple[str, ...]:
    """Paths of the loaded shared objects, in load order: the tuple ``ForkState.libraries`` holds
    (the same object while nothing was loaded or unloaded)."""
    return _dynamic_linker().loaded()


def _native_thread(tid: int, name: str) -> ForeignThread:
    try:
        fields = native.read_proc(f"/proc/self/task/{tid}/syscall").split()
    except OSError:  # exited meanwhile, or /proc restricted
        return ForeignThread(tid, name, "unknown", None)
    if not fields or fields[0] == "running":
        return ForeignThread(tid, name, "running", None)
    try:
        address = int(fields[-1], 16)  # "nr args... sp pc": the instruction pointer is last
    except ValueError:
        return ForeignThread(tid, name, "unknown", None)
    # The loaded object whose code holds it, from the code segments the thread-owner check listed
    # before the start (listed again only when something was loaded or unloaded): a lookup, where
    # dladdr held the dynamic-loader lock and released the GIL for each thread (about 40 us each).
    from .diagnostics import thread_owners  # here: importing safeloader imports none of the diagnostics

    return ForeignThread(tid, name, "blocked", thread_owners.code_owner_at(address))


def _known_thread(known: dict[tuple[int, str], ForeignThread], tid: int, name: str) -> ForeignThread:
    thread = known.get((tid, name))
    if thread is None:
        thread = known[(tid, name)] = _native_thread(tid, name)
    return thread


def _is_gomp(path: str) -> bool:
    return os.path.basename(path).startswith(_GOMP_PREFIX)


def _pools() -> tuple[tuple[Pool, ...] | None, str | None]:
    try:
        import threadpoolctl
    except ImportError:
        return None, "threadpoolctl is not installed: pools unknown (pip install torch-safeloader[threadpoolctl])"
    pools = tuple(
        Pool(
            info["user_api"],
            info["internal_api"],
            os.path.realpath(info["filepath"]),
            int(info["num_threads"]),
            info.get("version"),
        )
        for info in threadpoolctl.threadpool_info()
    )
    return pools, None


def _torch_facts() -> tuple[tuple[str, ...], int | None]:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):  # not imported, or mid-import
        return (), None
    return _torch_internals.initialised_accelerators(), torch.get_num_threads()


def snapshot(*, pools: bool = True, count_frozen: bool = True) -> ForkState:
    """Describe this process's threads, pools and accelerators now (about 1 ms; ``pools``: threadpoolctl's
    pools, another ms; ``count_frozen``: walks the frozen objects). The fork hooks pass False for both."""
    return _snapshot(pools=pools, count_frozen=count_frozen)


def _snapshot(*, pools: bool, count_frozen: bool, known: dict[tuple[int, str], ForeignThread] | None = None
              ) -> ForkState:
    """``snapshot``; ``known`` maps (tid, name) to threads already attributed, and gets the new ones."""
    census = native.thread_census()
    # dladdr and the loader's list hold glibc's loader lock: see _DynamicLinker.
    if known is None:
        threads = tuple(_native_thread(tid, name) for tid, name in census.foreign)
    else:
        threads = tuple(_known_thread(known, tid, name) for tid, name in census.foreign)
    libraries = _linker.loaded()
    gomp_loaded = _linker.gomp_loaded(libraries)
    gomp_live = tuple(sorted({t.library for t in threads if t.library is not None and _is_gomp(t.library)}))
    notes = []
    # A thread we cannot attribute might be an OpenMP pool thread: assume the worst.
    unknown = [t for t in threads if t.library is None]
    if not _GOMP_ATTRIBUTABLE:
        unknown += [t for t in threads if t.library is not None and not _is_gomp(t.library)]
    if gomp_loaded and unknown:
        gomp_unsafe = gomp_loaded
        notes.append(
            f"{len(unknown)} native thread(s) could not be attributed to a library; "
            "every loaded GNU OpenMP runtime is treated as used"
        )
    else:
        gomp_unsafe = gomp_live
    pool_list, pool_note = _pools() if pools else (None, None)
    if pool_note:
        notes.append(pool_note)
    accelerators, torch_threads = _torch_facts()
    return ForkState(
        pid=os.getpid(),
        fork_generation=native.fork_generation(),
        python_threads=census.python,
        native_threads=threads,
        gomp_loaded=gomp_loaded,
        gomp_live=gomp_live,
        gomp_unsafe=gomp_unsafe,
        pools=pool_list,
        accelerators=accelerators,
        torch_threads=torch_threads,
        gc_frozen=gc.get_freeze_count() if count_frozen else None,
        libraries=libraries,
        notes=tuple(notes),
    )


# -- the record taken around each worker fork -----------------------------------

_MEMO = "memo:forkstate"
"""The key of a fork's record in its memo (``ForkContext.memo``): taken by the first hook to ask."""


# What the earlier forks of a loader start (kept on its Arming, as ``forks``) found: where each native
# thread waits, read from /proc at 60-100 us per thread, and the last state with the thread ids it was
# taken with. A loader forks its workers within milliseconds: while the same threads run and no
# library was loaded, the next fork reuses the state. A pool that started in between has new thread
# ids, so the fork after it takes a new state (reading only the new threads).
@dataclass
class StartForks:
    known: dict[tuple[int, str], ForeignThread] = field(default_factory=dict)
    thread_ids: tuple[int, ...] | None = None
    state: ForkState | None = None
    modules: object = None
    """``_imports.modules_state()`` at the last record: an import may change a backend's plan."""


def record(ctx: Any) -> ForkState:
    """In the parent, during a worker fork's ``before`` phase (``ctx``: its ``ForkContext``): the
    state for this fork. Taken once per fork (kept in the fork's memo), so several backends can
    share it; the worker reads it as ``parent_state()``. ``ctx`` None: the process as it is now."""
    if ctx is None:
        return snapshot(pools=False, count_frozen=False)
    return ctx.memo(_MEMO, functools.partial(_record, ctx))


def _record(ctx: Any) -> ForkState:
    arming = ctx.start
    if arming is None:
        return snapshot(pools=False, count_frozen=False)
    forks = arming.forks
    if forks is None:
        forks = arming.forks = StartForks()
    thread_ids = tuple(native.thread_ids())
    libraries = _linker.loaded()  # the same tuple while nothing was loaded or unloaded
    if forks.state is None or forks.thread_ids != thread_ids or forks.state.libraries is not libraries:
        forks.state = _snapshot(pools=False, count_frozen=False, known=forks.known)
        forks.thread_ids = thread_ids
    forks.modules = modules_state()
    return forks.state


def forget() -> None:
    """Drop the dynamic loader's listing that ``record`` reuses: after a start an interrupt cut short,
    which may have cut a ctypes callback of the library walk short too (ctypes drops the exception:
    the walk goes on, and its list would miss objects)."""
    _linker._loaded = (None, ())


def parent_state() -> ForkState | None:
    """In a DataLoader worker: the parent's state just before it forked this worker; None elsewhere, when no
    hook recorded it, and after its hooks in a worker of a start safeloader did not arm."""
    worker = _context.worker
    if worker is None:
        return None
    forks = worker.start.forks if worker.start is not None else None
    state = forks.state if forks is not None else None  # the start's record, as it was at this fork
    if state is None and _context.fork_context() is worker:
        state = _context.plan_of(_MEMO)  # a start not armed: its fork's memo, while the worker's hooks run
    if state is None or state.fork_generation != native.fork_generation() - 1:
        return None
    return cast(ForkState, state)


def unchanged_since_record(arming: Any) -> bool:
    """Whether the parent has no thread, loaded library or imported module that it did not have at
    the start ``arming``'s last ``record`` (which then holds for this fork too: the start's
    ``per_start`` plans are reused)."""
    forks = arming.forks
    if forks is None or forks.state is None:
        return False
    if forks.state.libraries is not _linker.loaded() or forks.modules != modules_state():
        return False
    # A thread that ended since makes no plan wrong (a pool's threads are planned for as live).
    return forks.thread_ids is not None and native.threads_within(forks.thread_ids)


def record_for_later_forks(arming: Any) -> tuple[tuple[int, ...], tuple[int, int], tuple[int, str, object]] | None:
    """What the start ``arming``'s last ``record`` was taken with (thread ids, the dynamic loader's
    counters, ``modules_state()``), for the C path of its later forks (``_fast_fork``) to check as
    ``unchanged_since_record`` does; None where there is none."""
    forks = arming.forks
    if forks is None or forks.state is None or forks.thread_ids is None:
        return None
    counters = _linker._loaded[0] if forks.state.libraries is _linker._loaded[1] else None
    if counters is None or not isinstance(forks.modules, tuple):
        return None
    return forks.thread_ids, counters, forks.modules
