"""The "threadpools" backend: a thread budget for BLAS and OpenMP pools in each worker.

How it works and why: docs/internals.md, ``safeloader.backends.threadpools``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

from .. import _elf_symbols, _registry, forkstate, hook_names
from .._options import Options
from .._registry import fork_context
from ..diagnostics.native_libraries import Library
from ._backend import Backend

NAME = hook_names.THREADPOOLS

__all__ = ["BACKEND", "NAME", "status"]


@functools.cache
def _threadpoolctl_installed() -> bool:
    return importlib.util.find_spec("threadpoolctl") is not None


def status() -> str:
    """Whether the backend can act in this environment, in words."""
    if not _threadpoolctl_installed():
        return (
            "inactive: threadpoolctl is not installed, so BLAS/OpenMP pools in workers are not limited "
            "(pip install torch-safeloader[threadpoolctl])"
        )
    return "active: BLAS/OpenMP pools in each worker are limited to the thread budget"


@dataclass(frozen=True)
class _Plan:
    """Decided in the parent before a fork; the worker inherits it and only applies it."""

    limits: tuple[tuple[_Pool, int], ...]
    """(pool, threads) for each pool."""
    torch_threads: int
    torch_pinned: bool
    """torch's OpenMP runtime was used by the parent: more than 1 thread would hang."""


_controller: tuple[tuple[str, ...], tuple[_Pool, ...]] | None = None  # (loaded libraries, their pools)
_seen: dict[str, _Pool | None] = {}  # each loaded path ever looked at -> its pool, or None


@dataclass(frozen=True)
class _Pool:
    """A threadpoolctl library controller and what ``_before`` asks of it, worked out once."""

    library: Any
    path: str
    """Real path of its shared object."""
    openmp: bool
    in_torch: bool
    """The OpenMP runtime bundled in torch's wheel."""
    get_threads: Any = None
    """The C function that returns its thread count (what threadpoolctl calls), or None."""
    cpu_number: Any = None
    """OpenBLAS's exported ``blas_cpu_number`` (a ctypes int), or None."""
    set_threads: Any = None
    """OpenMP's ``omp_set_num_threads`` (what threadpoolctl calls), or None."""


def _c_accessors(library: Any) -> tuple[Any, Any, Any]:
    """(thread-count getter, OpenBLAS's ``blas_cpu_number``, OpenMP's setter) of
    ``library`` as ctypes objects, looked up once in the parent: a worker then reads
    and sets its count with C calls instead of threadpoolctl's symbol lookups (a new
    ctypes function object in every worker). None for what this does not know: the
    worker goes through threadpoolctl."""
    import ctypes

    dynlib = getattr(library, "dynlib", None)
    if dynlib is None:
        return None, None, None
    if library.internal_api == "openmp":
        return getattr(dynlib, "omp_get_max_threads", None), None, getattr(dynlib, "omp_set_num_threads", None)
    if not _pthreads_openblas(library):
        return None, None, None  # an OpenMP-layered OpenBLAS counts per thread: threadpoolctl knows how
    symbol = getattr(library, "_get_symbol", None)
    getter = symbol("openblas_get_num_threads") if symbol is not None else None
    try:
        cpu_number = ctypes.c_int.in_dll(dynlib, "blas_cpu_number")
    except ValueError:  # private in this build (OpenBLAS 0.3.34 in numpy 2.5): read its symbol table
        cpu_number = _private_cpu_number(library.filepath, getter)
    return getter, cpu_number, None


def _pthreads_openblas(library: Any) -> bool:
    return bool(library.internal_api == "openblas" and getattr(library, "threading_layer", None) != "openmp")


def _private_cpu_number(path: str, getter: Any) -> Any:
    """OpenBLAS's ``blas_cpu_number`` where the build keeps it private, found in the file's own
    symbol table: its offset, plus the load address (the exported getter's address minus its
    offset). Trusted only if it holds what the getter returns. None if anything is missing."""
    import ctypes

    name = getattr(getter, "__name__", None)
    if name is None:
        return None
    offsets = _elf_symbols.symbol_values(path, ("blas_cpu_number", name))
    address = ctypes.cast(getter, ctypes.c_void_p).value
    if len(offsets) != 2 or address is None:
        return None  # a stripped build
    base = address - offsets[name]
    cpu_number = ctypes.c_int.from_address(base + offsets["blas_cpu_number"])
    return cpu_number if cpu_number.value == getter() else None


def _pools(libraries: tuple[str, ...]) -> tuple[_Pool, ...]:
    """threadpoolctl's pools among the loaded ``libraries``, each path looked at once per process.

    Built in the parent and inherited: its ctypes handles stay valid in the
    child, which then only calls the set-threads functions (a worker pays
    microseconds instead of a library scan). threadpoolctl's own scan resolves
    the real path of every loaded object (15 ms with 300 loaded, at the first
    loader start); here only a file whose name, or whose link's target, has a
    BLAS/OpenMP prefix is handed to it, and a path once seen is not looked at again.
    """
    global _controller
    if _controller is not None and _controller[0] == libraries:
        return _controller[1]
    import threadpoolctl

    try:
        prefixes = tuple(p for cls in threadpoolctl._ALL_CONTROLLERS for p in cls.filename_prefixes)
        for path in libraries:
            if path not in _seen:
                _seen[path] = _pool_at(path, prefixes, threadpoolctl.ThreadpoolController)
        found = (_seen[path] for path in libraries)
    except AttributeError:  # a threadpoolctl whose per-path step moved: its whole scan
        found = (_pool(library) for library in threadpoolctl.ThreadpoolController().lib_controllers)
    pools: dict[str, _Pool] = {}
    for pool in found:
        if pool is not None:
            pools.setdefault(pool.path, pool)  # one pool per real file, as threadpoolctl keeps them
    _controller = (libraries, tuple(pools.values()))
    return _controller[1]


def _pool_at(path: str, prefixes: tuple[str, ...], controller_class: Any) -> _Pool | None:
    """The pool of the object loaded from ``path``, or None when threadpoolctl has no controller for
    it. Only a file whose name, or whose target's when it is a link (a system ``libblas.so.3`` to
    OpenBLAS), starts with one of its controllers' ``prefixes`` is handed to threadpoolctl."""
    if not os.path.basename(path).lower().startswith(prefixes) and not _links_to(path, prefixes):
        return None
    controller = controller_class._from_controllers([])
    controller._make_controller_from_path(path)
    return _pool(controller.lib_controllers[0]) if controller.lib_controllers else None


def _links_to(path: str, prefixes: tuple[str, ...]) -> bool:
    # A wheel cannot hold links: only a file outside site-packages (a system or conda lib/) is looked at.
    if f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path:
        return False
    return os.path.islink(path) and os.path.basename(os.path.realpath(path)).lower().startswith(prefixes)


def _pool(library: Any) -> _Pool:
    real = os.path.realpath(library.filepath)
    openmp = library.user_api == "openmp"
    torch_dir = _torch_dir()
    in_torch = openmp and bool(torch_dir) and real.startswith(torch_dir)
    return _Pool(library, real, openmp, in_torch, *_c_accessors(library))


def _torch_dir() -> str | None:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return os.path.realpath(os.path.dirname(path)) + os.sep if path else None


def _plan(state: forkstate.ForkState, pools: tuple[_Pool, ...], budget: int) -> _Plan:
    pinned_paths = frozenset(state.gomp_unsafe)
    limits = []
    torch_has_openmp = torch_pinned = False
    for pool in pools:
        pinned = pool.openmp and pool.path in pinned_paths
        threads = 1 if pinned else budget
        if threads < _threads(pool) and _lowers_in_place(pool):  # a budget only ever lowers a pool
            limits.append((pool, threads))
        if pool.in_torch:
            torch_has_openmp = True  # the runtime bundled in torch's wheel
            torch_pinned = torch_pinned or pinned
    if not torch_has_openmp and pinned_paths:
        # torch uses a shared OpenMP runtime (conda, system libgomp), or we
        # cannot tell which: any pinned runtime pins torch too.
        torch_pinned = True
    return _Plan(tuple(limits), 1 if torch_pinned else budget, torch_pinned)


def _threads(pool: _Pool) -> int:
    return int(pool.get_threads() if pool.get_threads is not None else pool.library.num_threads)


def _lowers_in_place(pool: _Pool) -> bool:
    """Whether a worker can lower the pool's count without starting threads. Not so for a pthreads
    OpenBLAS whose ``blas_cpu_number`` was not found: its only setter starts the whole pool again
    (the parent's count of threads, busy-waiting), in every worker at its start: 1.9x torch's start
    with 16 cores. Such a pool keeps the parent's count, as under torch's loader."""
    return pool.cpu_number is not None or not _pthreads_openblas(pool.library)


def _set_threads(pool: _Pool, threads: int) -> None:
    """Lower a pool's thread count in a freshly forked worker.

    OpenBLAS (pthreads) shut its pool down at fork; ``openblas_set_num_threads``
    starts it again on the spot, and its threads busy-wait for about 0.1 s of
    CPU per worker (it doubled the time to first batch with 4 workers on 2
    cores). Lowering the count only needs what that call ends with, writing
    OpenBLAS's ``blas_cpu_number``; the pool then starts lazily, at
    the worker's first BLAS call, with that count. Anything else goes through
    its C setter or threadpoolctl. A count already at or below ``threads`` is left.
    """
    library = pool.library
    current = pool.get_threads() if pool.get_threads is not None else library.num_threads
    if current <= threads:
        return  # even a same-value call restarts OpenBLAS's pool
    if pool.cpu_number is not None:
        pool.cpu_number.value = threads
        if (pool.get_threads() if pool.get_threads is not None else library.num_threads) == threads:
            return
    if pool.set_threads is not None:
        pool.set_threads(threads)
        return
    library.set_num_threads(threads)


from .._torch_internals import WORKER_LOOP_MODULES as _WORKER_LOOPS  # noqa: E402  (their loops set 1 thread)
from .._torch_internals import WORKER_LOOP_NAMES as _WORKER_LOOP_NAMES  # noqa: E402


class _TorchSetNumThreads:
    """Stands in for ``torch.set_num_threads`` in a worker.

    torch's worker loop calls ``torch.set_num_threads(1)`` after the fork
    hooks ran; that call gets the budget instead. Afterwards, if torch's
    OpenMP runtime was used by the parent, asking for more than one thread
    raises: libgomp would hang at the next parallel region.
    """

    def __init__(self, original: Any, budget: int, pinned: bool) -> None:
        self.original = original
        self.budget = budget
        self.pinned = pinned

    def __call__(self, num_threads: int) -> None:
        import torch

        caller = sys._getframe(1)
        module = caller.f_globals.get("__name__", "")
        if caller.f_code.co_name in _WORKER_LOOP_NAMES and module.startswith(_WORKER_LOOPS):
            self.original(self.budget)
            if not self.pinned:
                torch.set_num_threads = self.original  # nothing left to guard
            return
        if self.pinned and num_threads > 1:
            context = fork_context()
            worker = f"DataLoader worker {context.worker_id}" if context else "this DataLoader worker"
            raise RuntimeError(
                f"torch.set_num_threads({num_threads}) in {worker} would hang: the parent process ran an OpenMP "
                "parallel region before forking the worker, and GNU OpenMP hangs a forked child that later runs "
                "a parallel region with more than 1 thread. torch's threads must stay at 1 here. To use more, "
                "start the workers before the parent's first multi-threaded torch op (persistent_workers=True "
                "and iterate once early), or use multiprocessing_context='spawn'."
            )
        self.original(num_threads)


def _guard_torch_threads(budget: int, pinned: bool) -> None:
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return
    original = torch.set_num_threads
    original = getattr(original, "original", original)
    torch.set_num_threads = _TorchSetNumThreads(original, budget, pinned)


class ThreadpoolsBackend(Backend):
    name = hook_names.THREADPOOLS
    description = "each worker's BLAS/OpenMP pools are limited to the thread budget; GNU OpenMP kept safe"
    plan_per_start = True
    libraries = (
        Library(
            ("libgomp",),
            label="GNU OpenMP (libgomp)",
            hazard="A worker running a parallel region with >1 thread would hang",
            stall="the worker entered an OpenMP parallel region after the parent had run one; libgomp's thread "
            "pool does not survive fork and the region waits forever.",
            remedy="keep workers at 1 OpenMP thread (torch.set_num_threads(1) in worker_init_fn)",
        ),
        Library(("libopenblas", "libscipy_openblas"), label="OpenBLAS", alone="it restarts its threads in a child"),
        Library(("libomp", "libiomp"), label="LLVM/Intel OpenMP", alone="it restarts its threads in a child"),
        Library(("libmkl", "libblis", "libflexiblas"), alone="it restarts its threads in a child"),
    )

    def __init__(self) -> None:
        self._warned_inactive = False

    def before(self) -> _Plan | None:
        context = fork_context()
        if context is None:
            return None
        budget = context.options.threads_per_worker(context.num_workers)
        state = forkstate.record()
        return _plan(state, _pools(state.libraries), budget)

    def after_in_child(self, plan: _Plan | None) -> None:
        if plan is None:
            return
        for pool, threads in plan.limits:
            _set_threads(pool, threads)
        _guard_torch_threads(plan.torch_threads, plan.torch_pinned)

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        """Import threadpoolctl before the forks (an import between two forks would make the start's
        plans again); say once that a ``thread_budget`` the user set cannot be applied without it."""
        if _threadpoolctl_installed():
            if start_method == "fork" and "threadpoolctl" not in sys.modules and NAME not in options.disable_hooks:
                import threadpoolctl  # noqa: F401
            return
        if self._warned_inactive:
            return
        if options.thread_budget is not None and NAME not in options.disable_hooks:
            import warnings

            self._warned_inactive = True
            warnings.warn(f"safeloader: thread_budget={options.thread_budget} is ignored; {status()}", stacklevel=2)

    def status(self) -> str:
        return status()

    def register(self) -> _registry.Hook | None:
        # Without threadpoolctl the hook stays listed but inactive (Hook.active is
        # False) until threadpoolctl is imported, which means it got installed.
        self.requires = () if _threadpoolctl_installed() else ("threadpoolctl",)  # type: ignore[misc]
        return super().register()


BACKEND = ThreadpoolsBackend()
