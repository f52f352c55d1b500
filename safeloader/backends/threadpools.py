"""The "threadpools" backend: a thread budget for BLAS and OpenMP pools in each worker.

How it works and why: docs/internals.md, ``safeloader.backends.threadpools``.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from .. import _hooks, forkstate, hook_names
from .._context import ForkContext
from .._options import Options
from ..diagnostics.native_libraries import Library
from . import _gomp_pause, _torch_threads
from ._backend import Backend
from ._openblas_count import cpu_number as _cpu_number

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
    torch_pinned: str
    """Why more than 1 thread of torch's OpenMP runtime would hang in the worker: the parent's pool
    of it could not be released ('' when it was, or there was none)."""
    unreleased: tuple[tuple[str, str], ...] = ()
    """(libgomp copy, why) for each GNU OpenMP pool of the parent's that could not be released: its
    workers' OpenMP stays at 1 thread, which a library setting its own count overrides."""


_controller: tuple[tuple[str, ...], tuple[_Pool, ...]] | None = None  # (loaded libraries, their pools)
_seen: dict[str, _Pool | None] = {}  # each loaded path ever looked at -> its pool, or None

# File-name prefixes of the pools read here with ctypes (the common ones: numpy's and scipy's
# OpenBLAS, torch's GNU OpenMP), and of the others threadpoolctl knows (MKL, BLIS, FlexiBLAS, a
# system libblas): only these are handed to threadpoolctl, imported then.
_OPENBLAS = ("libopenblas", "libscipy_openblas")
_OPENMP = ("libgomp", "libomp", "libiomp")
_OTHERS = ("libmkl_rt", "mkl_rt", "libblis", "libblas", "libflexiblas", "vcomp", "openblas")
_PREFIXES = _OPENBLAS + _OPENMP + _OTHERS
# Any of them anywhere in a file name: one search per loaded object instead of a test per prefix
# (370 objects at a first start with 300 extension modules); a name without one can still be a link.
_NAME_HINT = re.compile("|".join(re.escape(prefix) for prefix in _PREFIXES))
_KEYS = ("blas", "omp", "mkl", "blis")  # each prefix holds one (tests/test_threadpools.py)
_EXTENSION_SUFFIXES = tuple(suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES if suffix != ".so")


@dataclass(frozen=True)
class _Pool:
    """A BLAS/OpenMP library's thread count, as ctypes functions looked up once in the parent: a
    worker then reads and sets it with C calls (no symbol lookup, no new ctypes object there)."""

    path: str
    """Real path of its shared object."""
    openmp: bool
    in_torch: bool
    """The OpenMP runtime bundled in torch's wheel."""
    get_threads: Any = None
    """The C function that returns its thread count, or None (then ``library`` is asked)."""
    cpu_number: Any = None
    """OpenBLAS's ``blas_cpu_number`` (a ctypes int), or None."""
    set_threads: Any = None
    """The C function that sets its thread count, or None (then ``library`` sets it)."""
    pthreads_openblas: bool = False
    """An OpenBLAS on its own threads, whose setter starts its pool again in a forked worker."""
    library: Any = None
    """threadpoolctl's controller, for a library not read here (MKL, BLIS...), else None."""


def _pools(libraries: tuple[str, ...]) -> tuple[_Pool, ...]:
    """The BLAS/OpenMP pools among the loaded ``libraries``, each path looked at once per process.

    Built in the parent and inherited: its ctypes handles stay valid in the child, which then only
    calls the set-threads functions (a worker pays microseconds instead of a library scan). Only a
    file whose name, or whose link's target, has a BLAS/OpenMP prefix is looked at: OpenBLAS and
    OpenMP runtimes with ctypes, others through threadpoolctl (its whole scan resolves the real path
    of every loaded object: 15 ms with 300 loaded, at the first loader start; its import: 2 ms).
    """
    global _controller
    if _controller is not None and _controller[0] == libraries:
        return _controller[1]
    new = [path for path in libraries if path not in _seen]
    if new:
        # Most loaded objects are none of these: the names with a prefix of ours are found by one
        # search over all of them (at a first start with 300 extension modules, 370 objects: a
        # Python test per object took 1-1.5 ms), and only the others that may be links are tried.
        named = _named(new)
        for path in new:
            _seen[path] = _pool_at(path) if path in named or _may_link(path) else None
    pools: dict[str, _Pool] = {}
    for path in libraries:
        pool = _seen[path]
        if pool is not None:
            pools.setdefault(pool.path, pool)  # one pool per real file, as threadpoolctl keeps them
    _controller = (libraries, tuple(pools.values()))
    return _controller[1]


def _named(paths: list[str]) -> set[str]:
    """The ``paths`` whose file name holds a prefix of ours. Each prefix holds one of _KEYS: the
    paths are searched for those at C speed, all at once (a regular expression or a test per path
    took 0.5-1.5 ms over the 370 objects of a process with 300 extension modules)."""
    text = "\n".join(paths)
    lowered = text.lower()
    named = set()
    for key in _KEYS:
        found = lowered.find(key)
        while found >= 0:
            start = lowered.rfind("\n", 0, found) + 1
            end = lowered.find("\n", found)
            end = len(lowered) if end < 0 else end
            if _NAME_HINT.search(lowered, lowered.rfind("/", start, end) + 1, end):
                named.add(text[start:end])
            found = lowered.find(key, end)
    return named


def _pool_at(path: str) -> _Pool | None:
    """The pool of the object loaded from ``path``, or None when it is no BLAS/OpenMP library."""
    name = os.path.basename(path).lower()
    if _NAME_HINT.search(name) is None:  # no prefix of ours (most loaded objects)
        return _threadpoolctl_pool(path) if _links_to(path) else None
    if name.startswith(_OPENBLAS):
        return _openblas_pool(path) or _threadpoolctl_pool(path)
    if name.startswith(_OPENMP):
        return _openmp_pool(path) or _threadpoolctl_pool(path)
    if name.startswith(_OTHERS) or _links_to(path):
        return _threadpoolctl_pool(path)  # also a system libblas.so.3 linked to OpenBLAS
    return None


def _loaded(path: str) -> Any:
    import ctypes

    try:
        return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)  # the object loaded: never a new load
    except OSError:
        return None


def _openblas_pool(path: str) -> _Pool | None:
    """OpenBLAS's functions, under the names its builds give them (``scipy_openblas_..._64_``...)."""
    dynlib = _loaded(path)
    names = [(prefix, suffix) for prefix in ("", "scipy_") for suffix in ("", "64_", "_64")]
    found = next(((p, s) for p, s in names if hasattr(dynlib, f"{p}openblas_get_num_threads{s}")), None)
    if found is None:
        return None
    prefix, suffix = found
    getter = getattr(dynlib, f"{prefix}openblas_get_num_threads{suffix}")
    setter = getattr(dynlib, f"{prefix}openblas_set_num_threads{suffix}", None)
    parallel = getattr(dynlib, f"{prefix}openblas_get_parallel{suffix}", None)
    if setter is None or parallel is None:
        return None
    pthreads = parallel() != 2  # 2: OpenMP-threaded, which counts per calling thread
    cpu_number = _cpu_number(dynlib, getter) if pthreads else None
    return _Pool(os.path.realpath(path), False, False, getter, cpu_number, setter, pthreads)


def _openmp_pool(path: str) -> _Pool | None:
    dynlib = _loaded(path)
    getter = getattr(dynlib, "omp_get_max_threads", None)
    setter = getattr(dynlib, "omp_set_num_threads", None)
    if getter is None or setter is None:
        return None
    real = os.path.realpath(path)
    torch_dir = _torch_dir()
    return _Pool(real, True, torch_dir is not None and real.startswith(torch_dir), getter, None, setter)


def _threadpoolctl_pool(path: str) -> _Pool | None:
    """The pool threadpoolctl finds at ``path`` (None: none, or its per-path step moved)."""
    import threadpoolctl

    try:
        controller = threadpoolctl.ThreadpoolController._from_controllers([])
        controller._make_controller_from_path(path)
    except AttributeError:
        return None
    if not controller.lib_controllers:
        return None
    library = controller.lib_controllers[0]
    real = os.path.realpath(library.filepath)
    openmp = library.user_api == "openmp"
    torch_dir = _torch_dir()
    in_torch = openmp and torch_dir is not None and real.startswith(torch_dir)
    pthreads = library.internal_api == "openblas" and getattr(library, "threading_layer", None) != "openmp"
    getter, cpu_number, setter = _c_accessors(library, pthreads)
    return _Pool(real, openmp, in_torch, getter, cpu_number, setter, pthreads, library)


def _c_accessors(library: Any, pthreads_openblas: bool) -> tuple[Any, Any, Any]:
    """(thread-count getter, OpenBLAS's ``blas_cpu_number``, setter) of a threadpoolctl controller's
    library as ctypes objects; None for what is not known here (threadpoolctl is asked)."""
    dynlib = getattr(library, "dynlib", None)
    if dynlib is None:
        return None, None, None
    if library.internal_api == "openmp":
        return getattr(dynlib, "omp_get_max_threads", None), None, getattr(dynlib, "omp_set_num_threads", None)
    if not pthreads_openblas:
        return None, None, None  # an OpenMP-layered OpenBLAS counts per thread: threadpoolctl knows how
    symbol = getattr(library, "_get_symbol", None)
    getter = symbol("openblas_get_num_threads") if symbol is not None else None
    return getter, _cpu_number(dynlib, getter), None


def _may_link(path: str) -> bool:
    """Whether the object loaded from ``path`` can be a link (``_links_to`` then looks). A wheel cannot
    hold links: only a file outside site-packages (a system or conda lib/) can be, and no Python
    extension module (Python's own lib-dynload: about 200 system calls saved at the first loader
    start of a process with 300 libraries)."""
    return not (f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path
                or path.endswith(_EXTENSION_SUFFIXES))


def _links_to(path: str) -> bool:
    """Whether ``path`` is a link (or a chain of them) to a file named with a prefix of ours (a system
    libcblas.so.3 to OpenBLAS). The links' own names are read (``os.readlink``: one system call for a
    file that is none), not every component of a real path (``os.path.realpath``: one per component)."""
    if not _may_link(path):
        return False
    target = path
    for _hop in range(40):  # the kernel's limit on a chain of links
        try:
            link = os.readlink(target)
        except OSError:  # no link (EINVAL), or gone
            break
        target = os.path.join(os.path.dirname(target), link)
        if os.path.basename(target).lower().startswith(_PREFIXES):
            return True
    return False


def _torch_dir() -> str | None:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return os.path.realpath(os.path.dirname(path)) + os.sep if path else None


def _plan(unreleased: dict[str, str], pools: tuple[_Pool, ...], budget: int, torch_threads: int) -> _Plan:
    """The worker's limits: the budget, but 1 thread for a GNU OpenMP copy in ``unreleased`` (a
    pool of the parent's that could not be released, with why), where more would hang."""
    limits = []
    torch_has_openmp = False
    torch_pinned = ""
    for pool in pools:
        pinned = unreleased.get(pool.path, "") if pool.openmp else ""
        threads = 1 if pinned else budget
        if threads < _threads(pool) and _lowers_in_place(pool):  # a budget only ever lowers a pool
            limits.append((pool, threads))
        if pool.in_torch:
            torch_has_openmp = True  # the runtime bundled in torch's wheel
            torch_pinned = torch_pinned or pinned
    if not torch_has_openmp and unreleased:
        # torch uses a shared OpenMP runtime (conda, system libgomp), or we
        # cannot tell which: any pinned runtime pins torch too.
        torch_pinned = next(iter(unreleased.values()))
    return _Plan(tuple(limits), 1 if torch_pinned else torch_threads, torch_pinned, tuple(unreleased.items()))


def _threads(pool: _Pool) -> int:
    return int(pool.get_threads() if pool.get_threads is not None else pool.library.num_threads)


def _lowers_in_place(pool: _Pool) -> bool:
    """Whether a worker can lower the pool's count without starting threads. Not so for a pthreads
    OpenBLAS whose ``blas_cpu_number`` was not found: its only setter starts the whole pool again
    (the parent's count of threads, busy-waiting), in every worker at its start: 1.9x torch's start
    with 16 cores. Such a pool keeps the parent's count, as under torch's loader."""
    return pool.cpu_number is not None or not pool.pthreads_openblas


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


def _unreleased_message(path: str, why: str) -> str:
    return (
        f"safeloader: the GNU OpenMP pool of {os.path.basename(path)} ({path}) could not be released before "
        f"forking DataLoader workers: {why}. Its workers' OpenMP threads are limited to 1, but a library that "
        "sets its own OpenMP thread count (an n_jobs or num_threads argument) makes a worker wait forever in "
        "its next parallel region. Start the loader outside OpenMP parallel regions, or use "
        "multiprocessing_context='forkserver' (or 'spawn')."
    )


class ThreadpoolsBackend(Backend):
    name = hook_names.THREADPOOLS
    description = ("each worker's BLAS/OpenMP pools are limited to the thread budget; the parent's GNU OpenMP pool "
                   "is released before each fork")
    plan_per_start = True
    libraries = (
        Library(
            ("libgomp",),
            label="GNU OpenMP (libgomp)",
            hazard="A worker running a parallel region with >1 thread would hang",
            stall="the worker entered an OpenMP parallel region after the parent had run one; libgomp's thread "
            "pool does not survive fork and the region waits forever.",
            remedy="keep workers at 1 OpenMP thread (torch.set_num_threads(1) in worker_init_fn) if no library "
            "there sets its own count (an n_jobs or num_threads argument)",
        ),
        Library(("libopenblas", "libscipy_openblas"), label="OpenBLAS", alone="it restarts its threads in a child"),
        Library(("libomp", "libiomp"), label="LLVM/Intel OpenMP", alone="it restarts its threads in a child"),
        Library(("libmkl", "libblis", "libflexiblas"), alone="it restarts its threads in a child"),
    )

    def __init__(self) -> None:
        self._warned_inactive = False
        self._warned_unreleased: set[str] = set()  # libgomp copies already warned about in this process

    def before(self, ctx: ForkContext) -> _Plan | None:
        context = ctx
        if context is None:
            return None
        budget = context.options.threads_per_worker(context.num_workers)
        # torch's own threads get a budget only when the user set one: torch.set_num_threads(n > 1)
        # starts n - 1 threads of torch's at once (its pthreadpool), in every worker at its start
        # (1.17x torch's warm start with 16 cores and 4 workers, against 1.11x without).
        torch_threads = budget if context.options.thread_budget is not None else 1
        state = forkstate.record(ctx)
        # GNU OpenMP: a pool this thread started would be the worker's, counting threads it does not
        # have. Released here, on the forking thread, right before the fork (only where a pool may be
        # live): the worker has none, whatever thread count a library sets there later.
        unreleased = _gomp_pause.release(state.gomp_unsafe, state.libraries) if state.gomp_unsafe else {}
        if unreleased:
            self._warn_unreleased(unreleased)
        return _plan(unreleased, _pools(state.libraries), budget, torch_threads)

    def _warn_unreleased(self, unreleased: dict[str, str]) -> None:
        """Say once per copy and process that a pool stays (here, before the fork: this hook's plan holds
        for the whole start, so it has no after_in_parent)."""
        import warnings

        for path, why in unreleased.items():
            if path not in self._warned_unreleased:
                self._warned_unreleased.add(path)
                warnings.warn(_unreleased_message(path, why), RuntimeWarning, stacklevel=2)

    def after_in_child(self, ctx: ForkContext, plan: _Plan | None) -> None:
        if plan is None:
            return
        for pool, threads in plan.limits:
            _set_threads(pool, threads)
        if plan.torch_threads > 1 or plan.torch_pinned:  # else torch's worker loop sets 1 itself
            _torch_threads.guard_torch_threads(plan.torch_threads, plan.torch_pinned)

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        """Say once that a ``thread_budget`` the user set cannot be applied without threadpoolctl."""
        if self._warned_inactive or _threadpoolctl_installed():
            return
        if options.thread_budget is not None and NAME not in options.disable_hooks:
            import warnings

            self._warned_inactive = True
            warnings.warn(f"safeloader: thread_budget={options.thread_budget} is ignored; {status()}", stacklevel=2)

    def status(self) -> str:
        return status()

    def register(self) -> _hooks.Hook | None:
        # Without threadpoolctl the hook stays listed but inactive (Hook.active is
        # False) until threadpoolctl is imported, which means it got installed.
        self.requires = () if _threadpoolctl_installed() else ("threadpoolctl",)  # type: ignore[misc]
        return super().register()


BACKEND = ThreadpoolsBackend()
