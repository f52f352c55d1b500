"""SafeDataLoader: torch's DataLoader with its worker forks armed; only ``_get_iterator``, where torch forks
them, is wrapped (queues, prefetching, pin memory and shutdown are torch's)."""

from __future__ import annotations

import enum
import functools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from torch.utils.data import DataLoader as _TorchDataLoader

from . import (
    _abandoned_locks,
    _context,
    _dispatch,
    _done_event,
    _fork_check,
    _hooks,
    _torch_internals,
    backends,
    forkstate,
    watchdog,
)
from ._deferred_signals import DeferredSignals
from ._interrupts import is_interrupt
from ._options import OPTION_NAMES, Options, get_options, hook_names
from .diagnostics import unsafe_fork
from .errors import HookError, UnarmedWorkersError


class _Default(enum.Enum):
    DEFAULT = "default"

    def __repr__(self) -> str:
        return "safeloader.DEFAULT"


DEFAULT = _Default.DEFAULT
"""Use the process-wide default set with ``safeloader.configure``."""

T_co = TypeVar("T_co", covariant=True)



class WorkerInit:
    """safeloader's ``worker_init_fn`` (picklable): raises the worker's failed ``after_in_child`` hook through
    torch's worker-error path, then calls the user's ``worker_init_fn``."""

    def __init__(self, user_fn: Callable[[int], None] | None, watch: watchdog.Watch | None = None) -> None:
        self.user_fn = user_fn
        self.watch = watch  # the stall watchdog's heartbeats, or None when it is off

    def __call__(self, worker_id: int) -> None:
        if self.watch is not None:
            self.watch.enter_worker(worker_id)  # already done at fork; spawn/forkserver workers start here
            # torch's worker loop calls us with its result queue in scope.
            queue = _torch_internals.result_queue_of_worker_loop(sys._getframe(1))
            if queue is not None:
                self.watch.watch_result_queue(worker_id, queue)
        _dispatch.raise_child_failure()
        if self.user_fn is not None:
            self.user_fn(worker_id)
        if self.watch is not None:
            self.watch.worker_ready(worker_id)


def resolve_options(loader: Any) -> Options:
    """The options for ``loader``: its own settings over the process-wide defaults."""
    overrides = {}
    for name in OPTION_NAMES:
        value = getattr(loader, name, DEFAULT)
        if value is not DEFAULT:
            overrides[name] = value
    return get_options().replace(**overrides) if overrides else get_options()


def _fork_is_default() -> bool:
    """Whether torch would fork workers when given no context (False on 3.14+)."""
    return _torch_internals.fork_is_default()


def _start_method(loader: Any) -> str:
    return _torch_internals.start_method(loader.multiprocessing_context)


_start_locks: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_start_locks_lock = threading.Lock()


def _start_lock(loader: Any) -> threading.RLock:
    """One lock per loader: its attributes are swapped while torch starts its workers,
    so two threads calling ``iter(loader)`` at once must not interleave the swaps."""
    with _start_locks_lock:
        lock = _start_locks.get(loader)
        if lock is None:
            lock = _start_locks[loader] = threading.RLock()
        return lock


def _hazards_of(options: Options, loader: weakref.ref[Any]) -> list[unsafe_fork.Hazard]:
    return _fork_check.hazards(options, loader())


def start_armed(loader: Any, start: Callable[[], Any]) -> Any:
    """Run ``start`` (torch's ``_get_iterator``) with the worker forks armed."""
    if loader.num_workers == 0 or _context.armed() is not None:
        return start()  # no workers, or already armed by an outer call
    with _start_lock(loader), DeferredSignals() as signals:
        return _start_armed(loader, start, signals)


def _start_armed(loader: Any, start: Callable[[], Any], signals: DeferredSignals) -> Any:
    _torch_internals.check()
    if _torch_internals.uses_thread_workers(loader):
        _warn_thread_workers()
        return start()
    options = resolve_options(loader)
    user_init, user_context = loader.worker_init_fn, loader.multiprocessing_context
    # The user's attributes are swapped only while torch reads them to start
    # the workers; trainers that rebuild the loader see the user's values.
    # object.__setattr__ bypasses a __setattr__ that records attribute sets
    # (Lightning's, while it runs a fit), which would replay our swap later.
    #
    # Ctrl-C (or any signal handler's exception) that comes during the start waits for its end
    # (``signals.pending``): the start is then undone and it is raised, as itself, once the
    # workers already forked are stopped as torch's own iterator stops them. A second one raises
    # at once: the fork hooks defer one that lands in them (arming.interrupt); one that lands in
    # torch's code ends start() (failure). Each step undoing the start is repeated until no
    # interrupt cut it short.
    watch = arming = iterator = failure = None
    lacking: tuple[unsafe_fork.Hazard, ...] = ()
    try:
        # Python 3.14 made forkserver the default: forked on Linux all the same, unless the user set
        # a start method explicitly with set_start_method() (the rule: safeloader_start_method).
        if user_context is None and not _fork_is_default() and _torch_internals.safeloader_start_method() == "fork":
            object.__setattr__(loader, "multiprocessing_context", "fork")
        # May raise, or switch to forkserver (on_unsafe_fork); else the pools the workers will lack.
        lacking = _fork_check.apply(loader, options, _start_method(loader))
        start_method = _start_method(loader)
        if start_method == "fork":  # torch's own fork context, but for a done event no Ctrl-C leaves locked
            object.__setattr__(loader, "multiprocessing_context", _done_event.for_start(loader.multiprocessing_context))
        watch = watchdog.start_watch(loader, options, start_method)
        if watch is not None and start_method == "fork":
            watch.lacking = lacking
            watch.lacking_pools = frozenset(hazard.library for hazard in lacking)
            # The loader weakly: a persistent iterator (the loader's) holds the watch.
            watch.find_lacking_pools = functools.partial(_hazards_of, options, weakref.ref(loader))
        object.__setattr__(loader, "worker_init_fn", WorkerInit(user_init, watch))
        arming = _dispatch.arm(loader, options, watch)
        backends.prepare_start(loader, options, start_method)
        iterator = start()
    except BaseException as exc:
        failure = exc
    if arming is None:
        # Cut between arm() and the assignment: this thread's arming is ours all the same
        # (start_armed runs this only where the thread was not armed).
        arming = _context.armed()
    late = None  # an interrupt that landed while the start was undone
    for _attempt in range(_ATTEMPTS):
        try:
            _end_start(loader, user_init, user_context, arming)
            break
        except BaseException as exc:
            if late is None:
                late = exc
    if arming is not None and arming.interrupt is not None:
        if failure is None or not is_interrupt(failure):
            failure = arming.interrupt  # a hook's error or torch's reaction to it: the interrupt came first
    signals.restore()  # from here an interrupt is raised where it lands, as without safeloader
    if signals.pending is not None and (failure is None or not is_interrupt(failure)):
        failure = signals.pending  # it came first (a hook's or torch's error after it is dropped)
    if failure is None:
        failure = late or (arming.errors[0] if arming is not None and arming.errors else None)
    if failure is not None:
        if arming is not None:
            if arming.interrupt is not None or late is not None or is_interrupt(failure):
                forkstate.forget()
            half_built = iterator if iterator is not None else _half_built_iterator(failure)
            _stop_workers_despite_interrupts(half_built, arming)
        # A worker forked anyway (on_unsafe_fork "warn"/"ignore") that the library it lacks killed
        # before the start ended: torch's SIGCHLD handler raised it here, not in the iterator.
        explained = unsafe_fork.dead_worker_error(failure, lacking)
        if explained is not None:
            raise explained from failure
        raise failure
    assert arming is not None
    if arming.unrecognised and not arming.recognised:
        _torch_internals.shutdown_workers(iterator)
        raise UnarmedWorkersError(
            f"safeloader: this loader forked {arming.unrecognised} process(es) but none was recognised as a "
            "DataLoader worker, so no fork hook ran (this torch's worker loop is not one of "
            f"{_torch_internals.WORKER_LOOP_NAMES}). The workers were shut down rather than run unprotected. "
            "Use torch's own DataLoader (safeloader.uninstall()) or a torch release safeloader supports, "
            "and please report this torch version."
        )
    if watch is not None:
        watchdog.attach(iterator, watch)
    return iterator


_ATTEMPTS = 5
"""How many times a step undoing a start is run when interrupts keep cutting it short."""
_KILL_WAIT = 5.0
"""Seconds to wait for a killed worker to be reaped."""


def _end_start(loader: Any, user_init: Any, user_context: Any, arming: _context.Arming | None) -> None:
    """Give the user's attributes back and disarm; idempotent (run again if interrupted)."""
    object.__setattr__(loader, "worker_init_fn", user_init)
    object.__setattr__(loader, "multiprocessing_context", user_context)
    if arming is not None:
        _dispatch.disarm(arming)


def _half_built_iterator(failure: BaseException) -> Any:
    """The iterator whose ``__init__`` ``failure`` interrupted (found in its traceback), or None."""
    tb = failure.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self") if tb.tb_frame.f_code.co_name == "__init__" else None
        if candidate is not None and _torch_internals.has_workers_to_watch(candidate):
            return candidate
        tb = tb.tb_next
    return None


def _stop_workers_despite_interrupts(iterator: Any, arming: _context.Arming) -> None:
    """``_stop_workers``, run again where another interrupt cut it short (the first one is raised)."""
    for _attempt in range(_ATTEMPTS):
        try:
            _stop_workers(iterator, arming)
            return
        except BaseException:
            pass


def _stop_workers(iterator: Any, arming: _context.Arming) -> None:
    """Stop the workers of a start that failed or was interrupted, as torch's iterator does
    (``_shutdown_workers``), and the ones it forked but did not keep yet (interrupted between
    the fork and ``self._workers.append``). Idempotent: run again if interrupted."""
    _abandoned_locks.release_threading_lock()
    if iterator is not None:
        _abandoned_locks.release_queue_locks(iterator)
        try:
            _torch_internals.shutdown_workers(iterator)
        except Exception:  # an __init__ cut short lacks attributes it reads (killed below), or a
            pass  # signal handler raised in it (torch's SIGCHLD one, a worker killed by the same Ctrl-C)
        # That handler's error may have cut one of torch's puts short, its queue's lock held: the
        # queue's finalizer takes that lock when the iterator is collected.
        _abandoned_locks.release_queue_locks(iterator)
        _torch_internals.forget_worker_pids(iterator)
    for popen in arming.launches:
        if popen.pid is None or popen.returncode is not None:
            continue
        if popen.poll() is None:
            popen.kill()
            popen.wait(_KILL_WAIT)


_thread_workers_warned = False  # module state: said once per process, whichever loader


def _warn_thread_workers() -> None:
    global _thread_workers_warned
    if not _thread_workers_warned:
        _thread_workers_warned = True
        import warnings

        warnings.warn(
            "safeloader: this loader uses thread workers (worker_method='thread'): nothing is forked, so "
            "safeloader's fork hooks and stall watchdog do not apply; native libraries' own thread safety does",
            RuntimeWarning,
            stacklevel=4,
        )


class _SafeDataLoaderMeta(type):
    # After install(), torch.utils.data.DataLoader *is* SafeDataLoader, while
    # loaders built from a name imported earlier are plain torch loaders (and
    # armed too). Keep isinstance(x, torch.utils.data.DataLoader) true for
    # them, as trainers check it.
    def __instancecheck__(cls, obj: object) -> bool:
        if cls is SafeDataLoader and _context.installed():
            return isinstance(obj, _TorchDataLoader)
        return super().__instancecheck__(obj)

    def __subclasscheck__(cls, subclass: type) -> bool:
        if cls is SafeDataLoader and _context.installed():
            return issubclass(subclass, _TorchDataLoader)
        return super().__subclasscheck__(subclass)


# Generic like torch's class: after install() it stands in for torch's
# DataLoader, and libraries subscript that at import time
# (torchdata: ``class StatefulDataLoader(DataLoader[_T_co])``).
class SafeDataLoader(_TorchDataLoader[T_co], metaclass=_SafeDataLoaderMeta):
    """``torch.utils.data.DataLoader`` whose worker forks run safeloader's hooks.

    Takes exactly torch's arguments, plus, by keyword, the options of ``safeloader.Options`` for this
    loader (``zarrs_mode``, ``thread_budget``, ``freeze_gc``, ``stall_timeout``, ``disable_hooks``,
    ``on_unsafe_fork``; each defaults to ``safeloader.configure``'s setting). Every init argument is
    kept under the attribute of the same name; workers are forked on Linux unless a
    ``multiprocessing_context`` is given. Generic like torch's class (``DataLoader[T]``).
    Each option, and why: docs/usage.md."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        zarrs_mode: str | _Default = DEFAULT,
        thread_budget: int | _Default | None = DEFAULT,
        freeze_gc: bool | _Default = DEFAULT,
        stall_timeout: float | _Default | None = DEFAULT,
        disable_hooks: Any = DEFAULT,
        on_unsafe_fork: str | _Default = DEFAULT,
        **kwargs: Any,
    ) -> None:
        # The keywords above are Options' fields (tests/test_loader_parity checks they stay so);
        # each is kept as an attribute of its name, which resolve_options reads at each start.
        arguments = locals()
        given = {name: arguments[name] for name in OPTION_NAMES}
        if disable_hooks is not DEFAULT:
            # Read once (a generator, map(...)): kept as given, every start would read it empty.
            given["disable_hooks"] = hook_names(disable_hooks)
        # Validated now, not at the first fork.
        checked = get_options().replace(**{name: value for name, value in given.items() if value is not DEFAULT})
        if disable_hooks is not DEFAULT:
            _hooks.check_hook_names(checked.disable_hooks)
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            **kwargs,
        )
        self.shuffle = shuffle  # torch does not keep it; trainers rebuild from it
        for name, value in given.items():
            setattr(self, name, value)

    def _get_iterator(self) -> Any:
        return start_armed(self, super()._get_iterator)


__all__ = ["DEFAULT", "HookError", "SafeDataLoader", "WorkerInit"]
