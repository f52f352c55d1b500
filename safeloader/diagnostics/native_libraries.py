"""What safeloader knows about native libraries whose threads a forked worker does not get: one table, read by
the fork-time check (``unsafe_fork``), ``doctor`` and the stall report (why: docs/internals.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from . import duckdb_connections, onnxruntime_sessions
from .native_pools import package_by_place as _package_by_place
from .native_pools import package_of

__all__ = [
    "KNOWN", "SYSTEM_LIBRARIES", "Known", "Library", "classify", "entries", "entry", "handled_by", "is_system", "known",
    "package_of", "used_runtimes",
]

HANDLED = "handled"  # a backend resets or limits it; ``by`` names the backend
SURVIVES = "survives"  # the library copes with fork by itself; ``by`` says how
ABORTS = "aborts"  # the library kills a forked child that uses it; ``remedy`` is its own setting
HANGS = "hangs"  # a forked child that uses it waits forever; ``remedy`` is its own setting


@dataclass(frozen=True)
class Known:
    names: tuple[str, ...]
    """File-name prefixes of the shared objects, or names of the Python packages that ship them."""
    fork: str
    """HANDLED, SURVIVES, ABORTS or HANGS."""
    by: str
    """The backend that handles it (HANDLED), or why it is safe (SURVIVES) or how it fails (ABORTS)."""
    remedy: str = ""
    """The library's own fork-safe setting, where it has one."""
    since: str = ""
    """For SURVIVES: the first release of the package that does (older ones are unknown)."""
    label: str = ""
    """How reports name it ("GNU OpenMP (libgomp)"); '' for the package's name."""
    hazard: str = ""
    """What a forked worker suffers from it when nothing handles it, in a sentence."""
    stall: str = ""
    """Why a worker waiting inside it is stuck, for the stall report."""
    alone: str = ""
    """For HANDLED: why it is fork-safe even without its backend ('' when it is not)."""
    when: Callable[[], bool] | None = None
    """Whether the entry holds for this process as it is now (onnxruntime: how its live sessions
    run); None for always. Asked only for a library whose threads are live."""

    def applies(self, package: str) -> bool:
        """Whether the installed ``package`` is at least ``since`` (read from its metadata once) and
        the process is in the state ``when`` asks for."""
        return (not self.since or _at_least(package, self.since)) and (self.when is None or self.when())


@dataclass(frozen=True)
class Library:
    """A native library a backend makes safe in forked workers (``Backend.libraries``)."""

    names: tuple[str, ...]
    """File-name prefixes of its shared objects ("libgomp"), or its Python package's name."""
    label: str = ""
    """How reports name it; '' for its package's name."""
    hazard: str = ""
    """What a forked worker would suffer from it without the backend."""
    stall: str = ""
    """Why a worker waiting inside it is stuck (the stall report adds how to fix it)."""
    alone: str = ""
    """Why it is fork-safe even without the backend, if it is (the backend only limits it)."""
    remedy: str = ""
    """What else the user can do, besides turning the backend on."""

    def __post_init__(self) -> None:
        # Read once, as a tuple: matched with str.startswith (a list is a TypeError there, a
        # generator empty after the first look-up), and one name is one name, not its letters.
        names = (self.names,) if isinstance(self.names, str) else self.names
        if not isinstance(names, Iterable):
            raise TypeError(f"Library names must be a name or an iterable of names, got {self.names!r}")
        names = tuple(names)
        if not names or not all(isinstance(name, str) and name for name in names):
            raise TypeError(f"Library names must be non-empty str, at least one, got {names!r}")
        object.__setattr__(self, "names", names)


_handled: dict[str, tuple[Known, ...]] = {}  # backend name -> its HANDLED entries (``handled_by``)
version = 0
"""Bumped by every ``handled_by``: what is known of a library may have changed. Module state, as the
table is: the process's libraries, the process's backends."""


def handled_by(backend: str, libraries: tuple[Library | str, ...]) -> None:
    """Record that the backend ``backend`` makes ``libraries`` safe in each worker (a ``Library``, or
    a file-name prefix or package name): their threads are not a hazard while its hook runs. Each
    backend declares its own (``Backend.libraries``); registering it again replaces them."""
    global version
    entries = []
    for library in libraries:
        if isinstance(library, str):
            library = Library((library,))
        entries.append(
            Known(
                library.names, HANDLED, backend, library.remedy, label=library.label, hazard=library.hazard,
                stall=library.stall, alone=library.alone,
            )
        )
    _handled[backend] = tuple(entries)
    version += 1


KNOWN: tuple[Known, ...] = (
    # What is known of libraries no backend handles; the handled ones come from their backends.
    Known(("tokenizers",), SURVIVES, "turns its parallelism off in a forked child (and says so once)"),
    Known(
        ("libc10",),
        HANGS,
        "a task for torch's inter-op pool (torch.jit.fork in TorchScript, at::launch) waits forever in a forked "
        "worker: the pool is not started afresh there (checked: torch 2.13)",
        "start the workers before the parent first uses torch's inter-op pool, or pass on_unsafe_fork='ignore' "
        "if the workers never use it",
        label="torch's inter-op pool",
    ),
    Known(
        ("libtorch",),
        SURVIVES,
        "the thread of libtorch's own that torch's intra-op work leaves live: workers that do torch's work read "
        "what the parent reads (checked: torch 2.13)",
        label="torch (its own threads)",
    ),
    Known(("pyarrow", "libarrow"), SURVIVES, "restarts its thread pools in a forked child (Arrow's at-fork handlers)"),
    Known(
        ("duckdb",),
        SURVIVES,
        "no open connection's database has async I/O threads (async_threads=0): its scheduler copes with fork, "
        "a worker's query runs on its calling thread (checked: 2.0.1)",
        since="2.0",
        when=duckdb_connections.without_async_threads,
    ),
    Known(
        ("duckdb",),
        HANGS,
        "a query on a connection opened before the fork waits forever in a forked worker for DuckDB's async "
        "I/O threads (a parquet scan; checked: 2.0.1, also with SET threads=1)",
        "SET async_threads=0 on the connection in the parent before the loader starts, or open the connection "
        "in each worker",
        label="DuckDB",
    ),
    Known(
        ("onnxruntime",),
        SURVIVES,
        "every live InferenceSession runs sequentially (the default): a run in a forked worker does on the "
        "calling thread what no intra-op pool thread took (checked: 1.32)",
        when=onnxruntime_sessions.sequential_only,
    ),
    Known(
        ("onnxruntime",),
        HANGS,
        "an InferenceSession in ExecutionMode.ORT_PARALLEL: a run in a forked worker waits forever for its "
        "inter-op pool's threads (checked: 1.32)",
        "execution_mode=ExecutionMode.ORT_SEQUENTIAL (the default), or create the session in each worker",
        when=onnxruntime_sessions.parallel,
    ),
    Known(
        ("numcodecs",),
        SURVIVES,
        "C-Blosc's own at-fork handler drops its thread pool in a forked child, where numcodecs decodes "
        "without threads (checked: 0.16.6, 0.17.1)",
        since="0.16",
    ),
    Known(("numexpr",), SURVIVES, "restarts its thread pool in a forked child (its own at-fork handler)"),
    Known(
        ("pypocketfft", "pyduccfft"),
        SURVIVES,
        "scipy.fft's thread pool (pocketfft's, ducc0's) stops before a fork and starts afresh in the child (its "
        "own at-fork handlers; checked: scipy 1.17, 1.18)",
        label="scipy.fft's thread pool",
    ),
    Known(
        ("cv2",),
        SURVIVES,
        "runs its parallel loops on the calling thread in a forked child (its own at-fork handler; checked: 5.0)",
    ),
    Known(("ray",), SURVIVES, "Ray's threads serve the Ray worker; DataLoader workers do not call Ray"),
    Known(
        ("libcuda", "libcudart", "libnvidia", "libnccl", "libcupti", "nvidia"),
        SURVIVES,
        "torch refuses CUDA in a forked worker with its own error ('Cannot re-initialize CUDA')",
    ),
    Known(("tensorstore",), ABORTS, "TensorStore aborts a forked child that uses it ('fork() use detected')"),
    Known(  # numba.np.ufunc.omppool: found by its state (used_runtimes), its threads are GNU OpenMP's
        ("omppool",),
        ABORTS,
        "numba's OpenMP threading layer terminates a forked child that runs a parallel function",
        "NUMBA_THREADING_LAYER='workqueue' (set before numba is imported)",
    ),
    Known(  # numba.np.ufunc.workqueue
        ("workqueue",),
        SURVIVES,
        "numba's workqueue threading layer starts its threads afresh in a forked child (checked: 0.68)",
    ),
)


def used_runtimes() -> list[str]:
    """Objects of pools that run on another library's threads, used in this process (so that the
    threads alone do not name them): numba's OpenMP layer, on GNU OpenMP's threads, terminates
    a forked child that runs a parallel function once the parent ran one. Nothing is imported."""
    found = []
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    if parallel is not None and getattr(parallel, "_threading_layer", None) == "omp":
        pool = getattr(sys.modules.get("numba.np.ufunc.omppool"), "__file__", None)
        if isinstance(pool, str):
            found.append(pool)
    return found


# Objects a pool's thread waits *through*, not the pool's owner: the C and C++ runtimes, and the interpreter.
SYSTEM_LIBRARIES = ("libc.so", "libc-", "libpthread", "ld-linux", "ld64.so", "libstdc++", "libgcc_s", "libm.so")
_WITH_INTERPRETER = (*SYSTEM_LIBRARIES, "libpython", "python")


def is_system(path: str, interpreter: bool = True) -> bool:
    """Whether ``path`` is no object, or one of ``SYSTEM_LIBRARIES`` (and, with ``interpreter``, the interpreter's)."""
    return not path or path[path.rfind("/") + 1 :].startswith(_WITH_INTERPRETER if interpreter else SYSTEM_LIBRARIES)


def entry(path: str) -> tuple[Known | None, str]:
    """(``known(path)``, the package that ships ``path``), found cheaply: by the object's
    place under site-packages first, and from the imported modules (a pass over
    ``sys.modules``, a few ms in a large program) only when that matches no entry."""
    package = _package_by_place(path)
    found = known(path, package)
    if found is None:
        package = package_of(path)
        found = known(path, package)
    return found, package


def classify(
    paths: Iterable[str], wanted: Callable[[Known], bool] | None = None, *, table_order: bool = False
) -> tuple[Known | None, str, str | None]:
    """The library a thread is in, from the objects (or Python files) ``paths`` its stack shows, innermost first:
    (entry, package, path) for the first entry ``wanted`` accepts (``table_order``: by ``entries()``), else
    (None, the first path's package, the first path); (None, "", None) for no paths."""
    first: tuple[str, str] | None = None
    found: list[tuple[Known, str, str]] = []
    for path in paths:
        known, package = entry(path)
        first = first or (package, path)
        if known is not None and (wanted is None or wanted(known)):
            if not table_order:
                return known, package, path
            found.append((known, package, path))
    if found:
        table = entries()
        return min(found, key=lambda item: table.index(item[0]))
    return (None, *first) if first is not None else (None, "", None)


def entries() -> tuple[Known, ...]:
    """The whole table, in the order entries are matched: the backends' (in registration order), then ``KNOWN``."""
    return (*(known for entries in _handled.values() for known in entries), *KNOWN)


def known(path: str, package: str | None = None) -> Known | None:
    """The entry for the shared object ``path`` (shipped by ``package``), if any applies."""
    base = os.path.basename(path)
    package = package or package_of(path)
    for entry in entries():
        if (base.startswith(entry.names) or package in entry.names) and entry.applies(package):
            return entry
    return None


_versions: dict[str, tuple[int, ...] | None] = {}


def _at_least(package: str, since: str) -> bool:
    if package not in _versions:
        from importlib import metadata

        try:
            _versions[package] = _numbers(metadata.version(package))
        except Exception:  # not installed as a distribution of that name
            _versions[package] = None
    version = _versions[package]
    return version is not None and version >= _numbers(since)


def _numbers(version: str) -> tuple[int, ...]:
    """ "2.0.1rc1" -> (2, 0, 1): the leading digits of each dotted part."""
    numbers = []
    for part in version.split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)
