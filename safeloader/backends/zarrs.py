"""Built-in backend for zarrs (zarrs-python): forked DataLoader workers decode without hanging
(why: docs/internals.md)."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass
from types import ModuleType

from .. import _hooks, forkstate
from .._context import ForkContext
from .._imports import modules_state
from .._options import ZARRS_MODES
from ..diagnostics.native_libraries import Library
from ..errors import ZarrsFallbackWarning
from . import _zarrs_layout, _zarrs_native, _zarrs_pipelines
from ._backend import Backend, Hazard
from ._zarrs_layout import SUPPORTED_VERSIONS
from ._zarrs_pipelines import ZarrsStoreError, worker_mode

NAME = "zarrs"
PYTHON_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"

__all__ = ["BACKEND", "NAME", "SUPPORTED_VERSIONS", "ZarrsFallbackWarning", "ZarrsStoreError", "worker_mode"]


@dataclass(frozen=True)
class Plan:
    """What the worker about to be forked does; decided in the parent, inherited by the child."""

    mode: str
    threads: int  # rayon threads of the worker's own pool ("pool" mode)
    copy: ModuleType | None  # the loaded, never used copy to install ("pool" mode, zarrs' runtime live)
    bindings: tuple[_zarrs_native.Binding, ...] = ()  # zarrs' globals to point at the loaded copy


class ZarrsBackend(Backend):
    name = NAME
    description = "each worker decodes zarrs arrays with a fresh rayon pool (zarrs_mode)"
    plan_per_start = True
    requires = ("zarrs",)
    libraries = (
        Library(
            ("zarrs",),
            label="zarrs' rayon pool",
            hazard="Inherited without its threads, multi-chunk reads would hang",
            stall="the worker waits for rayon's global thread pool (zarrs decodes every multi-chunk read there). "
            "The parent created that pool before the fork (it opened or read an array with zarrs), and a forked "
            "child has the pool's bookkeeping but none of its threads, so the job never runs.",
            remedy="safeloader.configure(zarrs_mode='serial')",
        ),
    )

    def __init__(self) -> None:
        # What this process knows, filled in the parent under setup_lock (checks once, one copy).
        # Each fork's own decisions travel in its Plan: two threads may start workers at once.
        self.setup_lock = threading.Lock()
        self._spare: ModuleType | None = None  # a copy of zarrs' extension loaded here and never used
        self._source: str | None = None  # the extension's file, kept for workers whose own module is a copy
        self._resolved: dict[tuple[str, bool], str] = {}  # (requested mode, copy needed) -> mode in force
        self._bindings: tuple[_zarrs_native.Binding, ...] = ()  # found in the loaded zarrs modules of _bindings_key
        self._bindings_key: frozenset[tuple[str, ModuleType]] | None = None
        self._modules_seen: tuple[int, str, object] | None = None  # sys.modules when _bindings_key was checked
        self._real_paths: dict[str, str] = {}  # the extension's file -> its real path, as thread owners name it
        self._live_for: tuple[forkstate.ForkState, bool] | None = None  # runtime_live()'s answer, and its record
        _hooks.reset_in_child(self._new_setup_lock_in_child)

    def _new_setup_lock_in_child(self) -> None:
        # Another thread of the parent may have held the lock at the fork; the child
        # has no such thread, and a loader started in it must not wait forever. One nobody
        # held is kept: replacing it would write pages copied from the parent.
        if self.setup_lock.locked():
            self.setup_lock = threading.Lock()

    def resolve_mode(self, requested: str, copy: bool = True) -> str:
        """The mode workers will use for ``requested``: itself, or the first that can be set up (``copy``: "pool"
        needs the spare copy); warns once on a fallback, raises if none can."""
        with self.setup_lock:
            return self._resolve_mode_locked(requested, copy)

    def _resolve_mode_locked(self, requested: str, copy: bool) -> str:
        if (requested, copy) in self._resolved:
            return self._resolved[(requested, copy)]
        if requested not in ZARRS_MODES:
            raise ValueError(f"zarrs_mode must be one of {ZARRS_MODES}, got {requested!r}")
        problems = []
        for mode in ZARRS_MODES[ZARRS_MODES.index(requested) :]:
            problem = _zarrs_layout.MODE_PROBLEMS[mode]()
            if problem is None and mode == "pool" and copy:
                problem = self._ensure_copy()
            if problem is None:
                break
            problems.append(f"zarrs_mode={mode!r} needs: {problem}")
        else:
            raise RuntimeError(
                "safeloader cannot make zarrs safe in forked DataLoader workers: "
                + "; ".join(problems)
                + ". Use multiprocessing_context='spawn' or num_workers=0."
            )
        if problems:
            warnings.warn(
                f"safeloader: DataLoader workers decode zarrs arrays with zarrs_mode={mode!r} instead of "
                f"{requested!r}: " + "; ".join(problems) + f". Supported: {_supported_text()}.",
                ZarrsFallbackWarning,
                stacklevel=3,  # the caller of resolve_mode
            )
        self._resolved[(requested, copy)] = mode
        return mode

    def resolved_modes(self) -> dict[tuple[str, bool], str]:
        """(requested mode, spare copy needed) -> the mode in force, as checked so far in this process."""
        return dict(self._resolved)

    def forget_mode_checks(self, spare: bool = False) -> None:
        """Check again, at the next loader start, which mode can be set up (after zarrs was
        reinstalled in place, or between tests). A spare copy already loaded is kept, unless
        ``spare``: the next start that needs one then loads another (tests of a first load)."""
        with self.setup_lock:
            self._resolved.clear()
            if spare:
                self._spare = None

    def spare_copy(self) -> ModuleType | None:
        """The copy of zarrs' extension this process loaded for its workers, or None."""
        return self._spare

    def _ensure_copy(self) -> str | None:
        """Load this process's spare copy of the extension (never used here) once; why it failed, or None."""
        if self._spare is not None:
            return None
        if self._source is None:
            self._source = sys.modules[_zarrs_native.INTERNAL].__file__
        source = self._source
        if source is None:
            return f"{_zarrs_native.INTERNAL} has no file to copy"
        try:
            fd = _zarrs_native.make_copy(source)
        except OSError as exc:
            return f"a copy of {source} in memory, got {type(exc).__name__}: {exc}"
        try:
            # dlopen holds the dynamic loader's lock; the import runs it with the GIL held,
            # so no other Python thread forks meanwhile (and none is waited for).
            spare = _zarrs_native.load_copy(fd)
        except Exception as exc:  # nothing was installed: a slower mode is safe
            return f"a loadable copy of {source}, got {type(exc).__name__}: {exc}"
        finally:
            os.close(fd)
        spare.__file__ = source  # same bytes; the memfd path died with its descriptor
        self._spare = spare
        return None

    def current_bindings(self) -> tuple[_zarrs_native.Binding, ...]:
        """Every ``zarrs.*`` global bound to an object of ``zarrs._internal``, found again only after the
        loaded ``zarrs`` modules changed (O(1) per fork otherwise)."""
        seen = modules_state()
        with self.setup_lock:
            if seen == self._modules_seen:
                return self._bindings
            key = _loaded_zarrs_modules()
            if key != self._bindings_key:
                self._bindings = _zarrs_native.find_bindings(sys.modules[_zarrs_native.INTERNAL])
                self._bindings_key = key
            self._modules_seen = seen  # taken before the pass: an import during it is seen next time
            return self._bindings

    def runtime_live(self, ctx: ForkContext | None = None) -> bool:
        """Whether zarrs' extension has threads in this process (rayon's pool, tokio's runtime),
        or might have: a native thread whose owner cannot be read counts as one. ``ctx``: the fork
        whose record it reads (None: the process as it is now)."""
        from ..diagnostics import thread_owners

        state = forkstate.record(ctx)
        if self._live_for is not None and self._live_for[0] is state:
            return self._live_for[1]  # a loader's later forks, same threads: nothing new to write between forks
        path = getattr(sys.modules.get(_zarrs_native.INTERNAL), "__file__", None)
        if path is None:
            return True
        threads = tuple((thread.tid, thread.name) for thread in state.native_threads)
        real = self._real_paths.get(path) or self._real_paths.setdefault(path, os.path.realpath(path))
        live = any(owner is None or owner == real for owner in thread_owners.owners(threads).values())
        self._live_for = (state, live)
        return live

    def before(self, ctx: ForkContext) -> Plan | None:
        if ctx is None:  # only armed worker forks run this hook
            return None
        requested = ctx.options.zarrs_mode
        _zarrs_pipelines.patch()  # here, once per process, not in each worker
        # Only a runtime with threads needs the spare copy: a worker forked before zarrs' pool
        # started builds its own from the module it inherits (and the parent loads no copy).
        live = requested == "pool" and self.runtime_live(ctx)
        mode = self.resolve_mode(requested, copy=live)
        threads = ctx.options.threads_per_worker(ctx.num_workers)
        if mode == "pool" and live:
            return Plan(mode, threads, self._spare, self.current_bindings())
        return Plan(mode, threads, None)

    def after_in_child(self, ctx: ForkContext, plan: Plan | None) -> None:
        self._spare = None  # the inherited spare becomes this worker's module: a loader inside it loads its own...
        self._resolved.clear()  # ...checks its own module layout...
        self._modules_seen = None  # ...and finds its bindings again (installing the copy imports nothing)
        if plan is None:
            return
        mode = plan.mode
        if mode == "pool" and plan.copy is not None:
            mode = _install_private_pool(plan)
        elif mode == "pool":  # the inherited module's pool was never started: it starts here, this size
            os.environ["RAYON_NUM_THREADS"] = str(plan.threads)
        if mode == "serial":
            _configure_serial()
        elif mode == "python":
            _configure_python()
        _zarrs_pipelines.activate(mode)

    def hazards(self) -> list[Hazard]:
        """zarr-python's event-loop threads: zarr's own fork handler re-creates them (no hook needed)."""
        from . import _loop_threads

        found = _loop_threads.hazard("zarr.core.sync", "reset_resources_after_fork", hook=None)
        return [found] if found is not None else []


def _supported_text() -> str:
    dotted = _zarrs_layout.dotted
    return ", ".join(f"{lib}>={dotted(low)},<{dotted(high)}" for lib, (low, high) in SUPPORTED_VERSIONS.items())


def _loaded_zarrs_modules() -> frozenset[tuple[str, ModuleType]]:
    # The module objects count too: a module imported again (or the worker's own
    # _internal) is a new object under the same name. list(): atomic under the GIL.
    return frozenset(
        (name, module)
        for name, module in list(sys.modules.items())
        if (name == "zarrs" or name.startswith("zarrs.")) and module is not None
    )


def _install_private_pool(plan: Plan) -> str:
    """Install the worker's own copy of the extension (inherited unused); "serial" (with a warning) if that fails."""
    assert plan.copy is not None  # "pool" with zarrs' runtime live in the parent
    # rayon sizes its global pool from this when the copy first uses it.
    os.environ["RAYON_NUM_THREADS"] = str(plan.threads)
    old = sys.modules[_zarrs_native.INTERNAL]
    try:
        _zarrs_native.install_copy(old, plan.copy, plan.bindings)  # checks every binding before changing any
    except Exception as exc:  # nothing was changed: serial mode on the inherited module is safe
        warnings.warn(
            f"safeloader: DataLoader worker (pid {os.getpid()}) could not install a private copy of zarrs' "
            f"extension ({type(exc).__name__}: {exc}); it decodes with zarrs_mode='serial'.",
            ZarrsFallbackWarning,
            stacklevel=2,
        )
        return "serial"
    return "pool"


def _configure_serial() -> None:
    from zarr.core.config import config

    # Both are needed: one chunk at a time, and no inner (codec) parallelism.
    config.set({"codec_pipeline.chunk_concurrent_minimum": 1, "threading.max_workers": 1})


def _configure_python() -> None:
    from zarr.core.config import config
    from zarr.registry import get_pipeline_class

    zarrs_pipeline = sys.modules["zarrs.pipeline"].ZarrsCodecPipeline
    if issubclass(get_pipeline_class(), zarrs_pipeline):  # arrays opened in the worker skip zarrs too
        config.set({"codec_pipeline.path": PYTHON_PIPELINE})


BACKEND = ZarrsBackend()
