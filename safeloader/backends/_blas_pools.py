"""The BLAS and OpenMP pools among the loaded libraries (found in the parent, ``PoolFinder``) and how a
worker lowers their counts (``lower_threads``) (why: docs/internals.md, ``safeloader.backends.threadpools``)."""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from ._openblas_count import cpu_number as _cpu_number
from ._openblas_stop import ServerStop, private_copy, stop_while_parked

__all__ = [
    "KEYS", "PREFIXES", "Pool", "PoolFinder", "lower_threads", "lowers_in_place", "named", "stop_openblas_servers",
    "thread_count",
]

# File-name prefixes of the pools read here with ctypes (the common ones: numpy's and scipy's
# OpenBLAS, torch's GNU OpenMP), and of the others threadpoolctl knows (MKL, BLIS, FlexiBLAS, a
# system libblas): only these are handed to threadpoolctl, imported then.
_OPENBLAS = ("libopenblas", "libscipy_openblas")
_OPENMP = ("libgomp", "libomp", "libiomp")
_OTHERS = ("libmkl_rt", "mkl_rt", "libblis", "libblas", "libflexiblas", "vcomp", "openblas")
PREFIXES = _OPENBLAS + _OPENMP + _OTHERS
# Any of them anywhere in a file name: one search per loaded object instead of a test per prefix
# (370 objects at a first start with 300 extension modules); a name without one can still be a link.
_NAME_HINT = re.compile("|".join(re.escape(prefix) for prefix in PREFIXES))
KEYS = ("blas", "omp", "mkl", "blis")  # each prefix holds one (tests/test_threadpools.py)
_EXTENSION_SUFFIXES = tuple(suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES if suffix != ".so")


@dataclass(frozen=True)
class Pool:
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
    stop_servers: ServerStop | None = None
    """A private pthreads OpenBLAS's ``blas_thread_shutdown_``: the C function its own fork handler
    runs in the parent at every fork (its threads told to exit and joined; the next BLAS call starts
    them again), looked up at its first use; None for any other pool."""


class PoolFinder:
    """The pools among a process's loaded libraries, each path looked at once per process; held by the
    backend in the parent and inherited (its ctypes handles stay valid in the child)."""

    def __init__(self) -> None:
        self._last: tuple[tuple[str, ...], tuple[Pool, ...]] | None = None  # (loaded libraries, their pools)
        self._seen: dict[str, Pool | None] = {}  # each loaded path ever looked at -> its pool, or None

    def pools(self, libraries: tuple[str, ...]) -> tuple[Pool, ...]:
        """The BLAS/OpenMP pools among the loaded ``libraries``, one per real file."""
        if self._last is not None and self._last[0] == libraries:
            return self._last[1]
        seen = self._seen
        new = [path for path in libraries if path not in seen]
        if new:
            # Most loaded objects are none of these: the names with a prefix of ours are found by one
            # search over all of them (at a first start with 300 extension modules, 370 objects: a
            # Python test per object took 1-1.5 ms), and only the others that may be links are tried.
            found = named(new)
            for path in new:
                seen[path] = _pool_at(path) if path in found or _may_link(path) else None
        pools: dict[str, Pool] = {}
        for path in libraries:
            pool = seen[path]
            if pool is not None:
                pools.setdefault(pool.path, pool)  # one pool per real file, as threadpoolctl keeps them
        self._last = (libraries, tuple(pools.values()))
        return self._last[1]


def named(paths: list[str]) -> set[str]:
    """The ``paths`` whose file name holds a prefix of ours. Each prefix holds one of KEYS: the
    paths are searched for those at C speed, all at once (a regular expression or a test per path
    took 0.5-1.5 ms over the 370 objects of a process with 300 extension modules)."""
    text = "\n".join(paths)
    lowered = text.lower()
    hits = set()
    for key in KEYS:
        found = lowered.find(key)
        while found >= 0:
            start = lowered.rfind("\n", 0, found) + 1
            end = lowered.find("\n", found)
            end = len(lowered) if end < 0 else end
            if _NAME_HINT.search(lowered, lowered.rfind("/", start, end) + 1, end):
                hits.add(text[start:end])
            found = lowered.find(key, end)
    return hits


def _pool_at(path: str) -> Pool | None:
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


_OPENBLAS_AFFIXES = [(prefix, suffix) for prefix in ("", "scipy_") for suffix in ("", "64_", "_64")]


def _openblas_affixes(dynlib: Any) -> tuple[str, str] | None:
    """(prefix, suffix) of OpenBLAS's function names in this build (``scipy_openblas_..._64_``...),
    searched in threadpoolctl's order; None where it has no ``openblas_get_num_threads``."""
    return next(((p, s) for p, s in _OPENBLAS_AFFIXES if hasattr(dynlib, f"{p}openblas_get_num_threads{s}")), None)


def _openblas_pool(path: str) -> Pool | None:
    """OpenBLAS's functions, under the names its build gives them."""
    dynlib = _loaded(path)
    found = _openblas_affixes(dynlib)
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
    real = os.path.realpath(path)
    anchors = (f"{prefix}openblas_get_num_threads{suffix}", f"{prefix}openblas_set_num_threads{suffix}")
    stop_servers = ServerStop(dynlib, real, anchors) if pthreads and private_copy(real) else None
    return Pool(real, False, False, getter, cpu_number, setter, pthreads, stop_servers=stop_servers)


def stop_openblas_servers(pools: tuple[Pool, ...]) -> int:
    """In the parent, right before a fork it is about to make: what each pthreads OpenBLAS's own
    fork handler (``pthread_atfork``) will do at that fork, done now: its server threads told to
    exit and joined, to be started again by its next BLAS call. Threads that spin for work after a
    BLAS call (about 0.1 s) are then gone instead of running when the fork-time check reads them.
    Only while no other Python thread can be inside BLAS or enter it before the stop ends (this is the
    process's one Python thread, or the others are parked in the interpreter: ``stop_while_parked``):
    a call in progress on another would wait forever for threads told to exit (the fork handler
    takes that risk at the fork; a stop a few milliseconds earlier must not add to it), and only a
    private copy (``_openblas_stop``), which no native thread calls without a Python thread.
    Returns how many copies were stopped."""
    stops = [pool.stop_servers for pool in pools if pool.stop_servers is not None]
    if not stops:
        return 0
    if len(sys._current_frames()) > 1:  # only if none of the others can be inside BLAS, nor enter it
        return stop_while_parked(stops)
    return sum(1 for stop in stops if stop())


def _openmp_pool(path: str) -> Pool | None:
    dynlib = _loaded(path)
    getter = getattr(dynlib, "omp_get_max_threads", None)
    setter = getattr(dynlib, "omp_set_num_threads", None)
    if getter is None or setter is None:
        return None
    real = os.path.realpath(path)
    torch_dir = _torch_dir()
    return Pool(real, True, torch_dir is not None and real.startswith(torch_dir), getter, None, setter)


def _threadpoolctl_pool(path: str) -> Pool | None:
    """The pool threadpoolctl finds at ``path`` (None: none)."""
    library = _threadpoolctl_library(path)
    if library is None:
        return None
    real = os.path.realpath(library.filepath)
    openmp = library.user_api == "openmp"
    torch_dir = _torch_dir()
    in_torch = openmp and torch_dir is not None and real.startswith(torch_dir)
    pthreads = library.internal_api == "openblas" and getattr(library, "threading_layer", None) != "openmp"
    getter, cpu_number, setter = _c_accessors(library, pthreads)
    return Pool(real, openmp, in_torch, getter, cpu_number, setter, pthreads, library)


def _threadpoolctl_library(path: str) -> Any:
    """threadpoolctl's controller of the library loaded from ``path``, or None, through its private
    per-path step where it has one (docs/internals.md, ``safeloader.backends.threadpools``)."""
    import threadpoolctl

    try:
        controller = threadpoolctl.ThreadpoolController._from_controllers([])
        controller._make_controller_from_path(path)
    except AttributeError:  # a threadpoolctl without that step: its public scan
        real = os.path.realpath(path)
        every = threadpoolctl.ThreadpoolController().lib_controllers
        return next((library for library in every if os.path.realpath(library.filepath) == real), None)
    return controller.lib_controllers[0] if controller.lib_controllers else None


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
    affixes = _openblas_affixes(dynlib)  # the names threadpoolctl's controller calls
    getter = getattr(dynlib, "{}openblas_get_num_threads{}".format(*affixes), None) if affixes else None
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
        if os.path.basename(target).lower().startswith(PREFIXES):
            return True
    return False


def _torch_dir() -> str | None:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return os.path.realpath(os.path.dirname(path)) + os.sep if path else None


def thread_count(pool: Pool) -> int:
    return int(pool.get_threads() if pool.get_threads is not None else pool.library.num_threads)


def lowers_in_place(pool: Pool) -> bool:
    """Whether a worker can lower the pool's count without starting threads. Not so for a pthreads
    OpenBLAS whose ``blas_cpu_number`` was not found: its only setter starts the whole pool again
    (the parent's count of threads, busy-waiting), in every worker at its start: 1.9x torch's start
    with 16 cores. Such a pool keeps the parent's count, as under torch's loader."""
    return pool.cpu_number is not None or not pool.pthreads_openblas


def lower_threads(pool: Pool, threads: int) -> None:
    """Lower a pool's thread count in a freshly forked worker, starting no thread (OpenBLAS: its
    ``blas_cpu_number`` written); a count already at or below ``threads`` is left."""
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
