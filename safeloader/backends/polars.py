"""Built-in backend for polars: forked DataLoader workers run polars at full speed instead of hanging
(why: docs/internals.md)."""

from __future__ import annotations

import os
import re
import sys
import threading
from dataclasses import dataclass
from types import ModuleType

from .. import _hooks, forkstate
from .._context import ForkContext
from .._imports import modules_state
from ..diagnostics.native_libraries import Library
from ..errors import PolarsForkError
from . import _extension_copy, _polars_objects
from ._backend import Backend
from ._polars_objects import PolarsInheritedObjectError

NAME = "polars"
PACKAGES = ("polars", "_polars_runtime_32", "_polars_runtime_64", "_polars_runtime_compat")
SUPPORTED = ((2, 0), (3, 0))
# Threads polars' runtime starts: its rayon pool ("polars-0"...), tokio ("tokio-rt-worker"),
# its async executor. Any of them live: the pools exist. (Importing polars starts only its
# out-of-core cleaner, "polars-ooc-clea", and jemalloc's threads: the pools start on first use.)
RUNTIME_THREAD = re.compile(r"^(polars-\d+$|tokio-|async-executor)")

__all__ = ["BACKEND", "NAME", "PolarsForkError", "PolarsInheritedObjectError", "worker_runtime"]


@dataclass(frozen=True)
class Plan:
    """Decided in the parent before each fork, inherited by the worker."""

    threads: int
    copy_fd: int | None  # the runtime copy to load; None: the inherited module is safe as is
    references: tuple[_extension_copy.Reference, ...] = ()
    slots: tuple[_polars_objects.Slot, ...] = ()
    problem: str | None = None  # why polars cannot be made safe (the worker refuses polars calls)


def runtime_module() -> ModuleType | None:
    """polars' native extension module (``polars._plr`` is replaced by it at import)."""
    return sys.modules.get("polars._plr")


def pools_live() -> bool:
    """Whether polars' thread pools run in this process (their threads are named by polars)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if RUNTIME_THREAD.match(comm.read()):
                    return True
        except OSError:
            continue
    return False


def _version_problem() -> str | None:
    version = getattr(sys.modules.get("polars"), "__version__", "")
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or not (SUPPORTED[0] <= (int(match[1]), int(match[2])) < SUPPORTED[1]):
        low, high = (".".join(map(str, v)) for v in SUPPORTED)
        return f"polars must be >={low},<{high}, got {version!r}"
    native = runtime_module()
    path = getattr(native, "__file__", None)
    if native is None or not isinstance(path, str) or not os.path.isfile(path):
        return f"polars._plr must be an extension module loaded from a file, got {native!r}"
    return None


class PolarsBackend(Backend):
    name = NAME
    description = "each worker runs polars on its own copy of polars' runtime (fresh rayon pool and tokio runtime)"
    plan_per_start = True
    requires = ("polars",)
    libraries = (
        Library(
            ("polars", "_polars_runtime"),
            label="polars' rayon pool and tokio runtime",
            hazard="Inherited without its threads, its first parallel call would hang",
        ),
    )

    def __init__(self) -> None:
        # What this process knows, filled in the parent under setup_lock; each fork's own
        # decisions travel in its Plan.
        self.setup_lock = threading.Lock()
        self._copy_fd: int | None = None  # a memfd with the runtime's bytes, made once
        self._copy_problem: str | None = None  # why no copy can be made
        self._references: _References | None = None
        self.worker_runtime: str | None = None
        """In a worker: "copy" (its own polars runtime), "inherited" (the parent never started
        polars' pools); else None."""
        _hooks.reset_in_child(self._new_lock_in_child)

    def _new_lock_in_child(self) -> None:
        if self.setup_lock.locked():  # held by a thread of the parent at the fork (gone here)
            self.setup_lock = threading.Lock()

    def _ensure_copy(self) -> str | None:
        if self._copy_fd is None and self._copy_problem is None:
            self._copy_problem = _version_problem()
            if self._copy_problem is None:
                source = getattr(runtime_module(), "__file__", None)
                if source is None:
                    self._copy_problem = "polars' runtime extension has no file to copy"
                    return self._copy_problem
                try:
                    self._copy_fd = _extension_copy.make_copy(source, "polars")
                except OSError as exc:
                    self._copy_problem = f"a copy of {source}: {type(exc).__name__}: {exc}"
        return self._copy_problem

    def _current_references(self) -> _References:
        """What the worker must move, found again after any import (O(1) per fork otherwise)."""
        state = modules_state()
        if self._references is None or self._references[0] != state:
            native = runtime_module()
            assert native is not None
            self._references = (
                state, _extension_copy.find_references(native, PACKAGES), _polars_objects.find_slots(native)
            )
        return self._references

    def before(self, ctx: ForkContext) -> Plan | None:
        if ctx is None:
            return None
        threads = ctx.options.threads_per_worker(ctx.num_workers)
        return self._plan(forkstate.record(ctx), threads)

    def _plan(self, state: forkstate.ForkState, threads: int) -> Plan:
        # The threads listed for this fork (forkstate.record) say the same as pools_live(), without reading /proc again.
        if not any(RUNTIME_THREAD.match(thread.name) for thread in state.native_threads):
            return Plan(threads, None)
        with self.setup_lock:
            problem = self._ensure_copy()
            if problem is not None:
                return Plan(threads, None, problem=problem)
            _, references, slots = self._current_references()
            return Plan(threads, self._copy_fd, references, slots)

    def after_in_child(self, ctx: ForkContext, plan: Plan | None) -> None:
        inherited_fd = self._copy_fd
        self._copy_fd, self._copy_problem, self._references = None, None, None  # a loader in this worker starts over
        try:
            if plan is None:
                return
            if plan.problem is not None:
                _refuse_polars(plan.problem)
                return
            if plan.copy_fd is None:
                self.worker_runtime = "inherited"
                return
            _load_copy(plan)
            self.worker_runtime = "copy"
        finally:
            if inherited_fd is not None:
                os.close(inherited_fd)


_References = tuple[tuple[int, str, object], tuple[_extension_copy.Reference, ...], tuple[_polars_objects.Slot, ...]]


def _load_copy(plan: Plan) -> None:
    assert plan.copy_fd is not None
    os.environ["POLARS_MAX_THREADS"] = str(plan.threads)  # read when the copy builds its pool
    old = runtime_module()
    assert old is not None
    config = _saved_config()
    try:
        new = _extension_copy.load_copy(old.__name__, plan.copy_fd)
        new.__file__ = old.__file__  # same bytes; the descriptor's path dies with it
        _extension_copy.rebind(old, new, plan.references)
    except Exception as exc:
        _refuse_polars(f"loading a private copy of polars' runtime failed: {type(exc).__name__}: {exc}")
        return
    for name in [name for name, module in sys.modules.items() if module is old]:
        sys.modules[name] = new  # polars._plr and _polars_runtime_*._polars_runtime
    _extension_copy.clear_caches(("polars",))
    _polars_objects.install(old, new, plan.slots)
    if config is not None:
        try:
            sys.modules["polars"].Config.load(config)
        except Exception:  # a setting the copy refuses: defaults are still correct results
            pass


def _saved_config() -> str | None:
    """The parent's ``pl.Config`` settings (some live in the runtime's statics, which the copy lacks)."""
    try:
        return sys.modules["polars"].Config.save()
    except Exception:
        return None


def _refuse_polars(problem: str) -> None:
    """Make every call into the inherited polars runtime raise: better than hanging on its pool."""
    message = (
        f"safeloader: polars cannot run in this forked DataLoader worker (pid {os.getpid()}): the parent started "
        f"polars' thread pool before the fork, and {problem}. Use multiprocessing_context='forkserver' (or "
        "safeloader's on_unsafe_fork='forkserver'), or do not use polars in the parent before workers start."
    )
    native = runtime_module()
    if native is None:
        return
    sys.modules[native.__name__] = sys.modules["polars._plr"] = _Refusing(native.__name__, message)
    raise PolarsForkError(message)


class _Refusing(ModuleType):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(name)
        self._message = message

    def __getattr__(self, attribute: str) -> object:
        raise PolarsForkError(self._message)


BACKEND = PolarsBackend()


def worker_runtime() -> str | None:
    """In a worker: "copy" (its own polars runtime), "inherited" (the parent never started polars' pools); else None."""
    return BACKEND.worker_runtime
