"""The fork dispatch: one ``os.register_at_fork`` registration that recognises each DataLoader worker fork and
runs the registered hooks' phases (``_hooks``), handing each its fork's ``ForkContext`` and plan
(why: docs/internals.md)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from . import _context, _fast_fork, _fd_table, _hooks, _import_locks, _loader_lock, _torch_internals, forkstate, native
from ._context import NO_FORK, NO_PLANS, Arming, ForkContext, armed
from ._context import local as _local
from ._hooks import NOTHING_TO_DO, Hook
from ._interrupts import is_interrupt
from ._options import Options, get_options
from .errors import HookError, out_of_descriptors_hint

_child_failures: list[BaseException] = []
# No lock is held around forks: a fork never waits for another thread's fork or its
# at-fork callbacks. A fork waits only for safeloader's own short work holding glibc's
# dynamic-loader lock with the GIL released (_loader_lock: enter_fork, leave_fork).


def arm(loader: Any, options: Options, watch: Any = None) -> Arming:
    """Arm the worker forks this thread makes, until ``disarm``, as ``loader``'s, run with ``options``;
    the ``Arming`` collects hook errors and interrupts (on the main thread, unraisable ones too)."""
    global _previous_unraisablehook
    arming = Arming(loader, options, watch)
    _local.arming = arming
    if threading.current_thread() is threading.main_thread() and sys.unraisablehook is not _on_unraisable:
        _previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _on_unraisable
    return arming


def disarm(arming: Arming) -> None:
    """End the start ``arm`` began: close a fork an interrupt cut short, give back a lock ``logging``
    left held, disarm. Idempotent (an interrupt may cut it short too)."""
    if _fork_left_open():
        _close_fork(arming)
    if getattr(_local, "arming", None) is arming:
        arming.recognised += native.fast_fork_disarm()  # the forks recognised by the C path
        _local.fast_start = None
    for name, release in list(arming.holds.items()):
        release()
        arming.holds.pop(name, None)  # after: cut short between the two, it runs again (harmlessly)
    while arming.logging_unreleased:
        logging_lock = getattr(sys.modules.get("logging"), "_lock", None)
        if logging_lock is not None and logging_lock._is_owned():
            logging_lock.release()
        arming.logging_unreleased -= 1
    if getattr(_local, "arming", None) is arming:
        _local.arming = None
    if sys.unraisablehook is _on_unraisable and threading.current_thread() is threading.main_thread():
        sys.unraisablehook = _previous_unraisablehook



def _context_for_this_fork() -> tuple[ForkContext | None, FrameType | None]:
    """This fork's context, if it launches a DataLoader worker, and multiprocessing's launch frame."""
    arming = armed()
    if arming is None and not _context.installed():
        return None, None
    worker = _torch_internals.launching_worker()
    if worker is None:
        if arming is not None:
            arming.unrecognised += 1
        return None, None
    worker_id, num_workers, popen, launch = worker
    if arming is None:  # install() is on, but the loader's iterator is not ours to wrap
        return ForkContext(worker_id, num_workers, get_options()), launch
    arming.recognised += 1
    if popen is not None:
        arming.launches.append(popen)
    return ForkContext(worker_id, num_workers, arming.options, arming.loader, arming.watch, start=arming), launch


# -- dispatch ------------------------------------------------------------------


def _run_phase(
    phase: str,
    context: ForkContext | None,
    interrupts: list[BaseException],
    plans: dict[str, Any],
    planned_for_start: bool = False,
    hooks: tuple[Hook, ...] | None = None,
    start_plans: dict[str, Any] = NO_PLANS,
) -> list[HookError]:
    """Run ``phase``'s callbacks; their errors are returned as HookErrors, interrupts go to ``interrupts``.

    Every hook runs either way; an interrupted ``after_in_parent`` runs again. A backend's plan goes
    into, and comes from, ``plans``; ``planned_for_start``: the ``per_start`` plans are there already;
    ``hooks``: exactly the hooks to run; ``start_plans``: the start's plans in its worker."""
    errors = []
    for hook in _hooks.by_phase(phase) if hooks is None else hooks:
        call = hook._calls[phase]
        if hooks is None and planned_for_start and hook.per_start:
            continue
        if hooks is None and not hook._runs_for(context):
            continue
        plan = plans.get(hook.name, start_plans.get(hook.name)) if hook.planned and phase != "before" else None
        if plan is NOTHING_TO_DO:
            if phase == "after_in_child":
                continue  # its before found nothing for this worker to do
            plan = None
        for _attempt in range(3 if phase == "after_in_parent" else 1):
            try:
                if phase != "before":
                    call(context, plan)
                elif hook.planned:
                    plans[hook.name] = call(context)
                else:
                    call(context)
                break
            except BaseException as exc:  # SystemExit/KeyboardInterrupt too: never skip later hooks
                if is_interrupt(exc, in_worker=phase == "after_in_child"):
                    interrupts.append(exc)
                    continue
                where = f" in DataLoader worker {context.worker_id}" if context and phase == "after_in_child" else ""
                error = HookError(
                    f"safeloader fork hook {hook.name!r} failed in phase {phase!r}{where}: "
                    f"{type(exc).__name__}: {exc}{out_of_descriptors_hint(exc)}",
                    hook=hook.name,
                    phase=phase,
                    worker_id=context.worker_id if context else None,
                )
                error.__cause__ = exc
                errors.append(error)
                break
    return errors



def _defer(arming: Arming, exc: BaseException) -> None:
    if arming.interrupt is None:
        arming.interrupt = exc


_LOGGING_RELEASE = ("logging", "_releaseLock")  # logging's after_in_parent at-fork callback
_previous_unraisablehook: Callable[[Any], object] = sys.unraisablehook  # the process's, restored at disarm


def _on_unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook`` during a loader start on the main thread: an interrupt CPython could not
    raise (in an at-fork or ctypes callback, a ``__del__``) is deferred to the loader."""
    arming = getattr(_local, "arming", None)
    exc = unraisable.exc_value
    if arming is not None and exc is not None:
        try:
            interrupt = is_interrupt(exc)
        except BaseException:  # another interrupt landed here: this one is an interrupt too
            interrupt = True
        if interrupt:
            if arming.interrupt is None:
                arming.interrupt = exc
            callback = unraisable.object
            if callback is _on_before:
                _local.parent_failed = True  # `before` did not run: the worker runs no hook (it is stopped)
            elif (getattr(callback, "__module__", None), getattr(callback, "__name__", None)) == _LOGGING_RELEASE:
                arming.logging_unreleased += 1  # cut short before it released logging's lock: disarm does
            return
    _previous_unraisablehook(unraisable)



def _report_unarmed(errors: Sequence[BaseException]) -> None:
    # A fork we cannot fail (user os.fork, a foreign loader): the exception is
    # raised into os.register_at_fork, which prints it with its traceback.
    if errors:
        raise errors[0]


def _on_before() -> None:
    if _fast_before():
        return  # a later fork of a start, recognised and checked in C: nothing else to do (_fast_fork)
    arming = armed()
    try:
        if _fork_left_open():
            _close_fork(arming)  # the last fork's after_in_parent was cut short on its first instruction
        _python_fork(True)  # no C path while this fork is open: closed by _close_fork
        _local.fork_open = True
        _local.fork_entered = True  # before entering: leaving a fork not entered is harmless
        _loader_lock.enter_fork()  # left when the fork is closed (_close_fork); reset in the child
        context, launch = _context_for_this_fork()
        _local.pending = context
        # A start's later forks take its per_start hooks' plans as they are (no Python code of
        # theirs runs between forks: every page it wrote, the workers forked so far share).
        start = arming if arming is not None and context is not None and context._carrier else None
        start_plans = start.start_plans if start is not None else None
        planned_for_start = start_plans is not None and forkstate.unchanged_since_record(start)
        plans = _local.plans = {}
        # Not copied into this fork's plans: a copy writes a reference count on each plan object (pages
        # the workers forked so far share), and again when it is freed after the fork.
        _local.start_plans = start_plans if start_plans is not None and planned_for_start else NO_PLANS
        if context is not None:
            _import_locks.name_imports_in_other_threads()  # not waited for: the worker forgets them
        interrupts: list[BaseException] = []
        runs = start.start_runs if planned_for_start and start is not None else None
        if runs is not None and runs[0] != _hooks.version:
            runs = None  # a hook registered, removed, disabled or enabled since the start's first fork
        _local.after_hooks = runs[2] if runs is not None else None
        # The worker's hooks, known to the parent for this start: a worker then asks no hook whether it runs.
        _local.child_hooks = runs[3] if runs is not None else None
        errors = _run_phase("before", context, interrupts, plans, planned_for_start, runs[1] if runs else None)
        if start is not None and not planned_for_start and not errors and not interrupts:
            start.start_plans = {
                hook.name: plans[hook.name] for hook in _hooks.by_phase("before")
                if hook.per_start and hook.name in plans
            }
            start.start_runs = (
                _hooks.version,
                tuple(h for h in _hooks.by_phase("before") if not h.per_start and h._runs_for(context)),
                tuple(h for h in _hooks.by_phase("after_in_parent") if h._runs_for(context)),
                tuple(h for h in _hooks.by_phase("after_in_child") if h._runs_for(context)),
            )
            _local.after_hooks, _local.child_hooks = start.start_runs[2], start.start_runs[3]
            if context is not None and launch is not None:  # (always: `start` is this fork's loader's)
                _fast_fork.arm(start, context, start.start_runs, launch)
        if context is not None and context._carrier and arming is not None:
            arming.errors.extend(errors)
            _local.parent_failed = bool(errors)
        if interrupts:
            raise interrupts[0]
        if not (context is not None and context._carrier and arming is not None):
            _report_unarmed(errors)
    except BaseException as exc:
        if arming is None or not is_interrupt(exc):
            raise
        _defer(arming, exc)
        _local.parent_failed = True  # the worker runs no hook: the loader stops it


def _on_after_in_parent() -> None:
    if _fast_after_in_parent():
        return
    arming = armed()
    try:
        _close_fork(arming)
    except BaseException as exc:
        if arming is None or not is_interrupt(exc):
            raise
        _defer(arming, exc)
        _close_fork(arming)  # finish the rollback (idempotent)


def _fork_left_open() -> bool:
    """Whether this thread's last fork still has hooks to roll back or is still counted as forking."""
    return getattr(_local, "fork_open", False) or getattr(_local, "fork_entered", False)


def _close_fork(arming: Arming | None) -> None:
    """The parent's side of the end of a fork: every hook's after_in_parent, then _loader_lock's count.
    Idempotent: an interrupt that cut it short, or skipped it, is made up for by running it again."""
    context = getattr(_local, "pending", None)
    context = None if context is NO_FORK else context
    interrupts: list[BaseException] = []
    try:
        if getattr(_local, "fork_open", False):
            errors = _run_phase(
                "after_in_parent", context, interrupts, getattr(_local, "plans", NO_PLANS), False,
                getattr(_local, "after_hooks", None),
            )
            _local.fork_open = False
            if context is not None and context._carrier and arming is not None:
                arming.errors.extend(errors)
            elif errors:
                interrupts.append(errors[0])  # raised below, for os.register_at_fork to print
    finally:
        _local.pending = NO_FORK
        _local.plans = _local.start_plans = NO_PLANS
        _local.after_hooks = _local.child_hooks = None
        _local.parent_failed = False
        if getattr(_local, "fork_entered", False):
            _loader_lock.leave_fork()  # then unmarked: cut short between the two, a second leave is harmless
            _local.fork_entered = False
        _python_fork(False)
    if interrupts:
        if arming is not None and is_interrupt(interrupts[0]):
            _defer(arming, interrupts[0])
        else:
            raise interrupts[0]


def _on_after_in_child() -> None:
    fast = _fast_in_child()
    if fast is not None:  # its parent's `before` took the C path: the rest is the start's
        contexts, fast_plans, start_plans, child_hooks = _local.fast_start
        _local.pending = contexts[fast[0]]  # the C path checked its worker id against their number
        _local.plans, _local.start_plans, _local.child_hooks = fast_plans, start_plans, child_hooks
        _local.parent_failed = False
    # _local.fast_start is left as inherited: freeing it here would write the pages of every object
    # it holds (read only after this process arms a start of its own, which sets it anew).
    _loader_lock.reset_in_child()
    for reset in _hooks.child_resets:
        reset()
    context = getattr(_local, "pending", None)
    context = None if context is NO_FORK else context
    plans = getattr(_local, "plans", NO_PLANS)  # both kept while the worker's hooks run (plan_of)
    start_plans = getattr(_local, "start_plans", NO_PLANS)
    hooks = getattr(_local, "child_hooks", None)
    _local.child_hooks = None
    _local.pending = NO_FORK
    _local.arming = None  # the child is not starting workers
    _local.fork_open = _local.fork_entered = False  # the parent closes its fork; _loader_lock is new
    _child_failures.clear()
    _context.worker = context
    parent_failed = bool(getattr(_local, "parent_failed", False))  # the parent's `before` failed for this fork
    if context is not None:
        _import_locks.forget_imports_of_other_threads()  # before anything here imports
    if parent_failed:
        _local.plans = _local.start_plans = NO_PLANS
        return  # the parent raises and shuts this worker down; run nothing here
    if context is not None:
        _fd_table.grow_in_worker()  # before the worker's hooks and torch start any thread
    interrupts: list[BaseException] = []
    try:
        errors: list[BaseException] = list(
            _run_phase("after_in_child", context, interrupts, plans, hooks=hooks, start_plans=start_plans)
        )
    finally:
        _local.plans = _local.start_plans = NO_PLANS
    if not errors and not interrupts:
        return
    if context is not None and context._carrier:
        # Raised by WorkerInit through torch's error path; an interrupt (Ctrl-C to the process
        # group) as itself, first: torch's worker loop ends quietly on a KeyboardInterrupt.
        _child_failures.extend(interrupts + errors)
        return
    errors = interrupts + errors
    if context is None:
        _report_unarmed(errors)
        return
    # A worker of a loader whose worker_init_fn we do not wrap: no carrier
    # reaches the parent, and running on would risk a hang. Say why and exit;
    # torch reports the dead worker.
    import traceback

    traceback.print_exception(errors[0])
    sys.stderr.flush()
    os._exit(1)


def raise_child_failure() -> None:
    """In a worker: raise the first error of its after_in_child hooks, if any."""
    if _child_failures:
        raise _child_failures[0]


# Called bare at every fork: module globals bound to the C functions, not native.<name> lookups.
_fast_before = native.fast_fork_before
_fast_after_in_parent = native.fast_fork_after_in_parent
_fast_in_child = native.fast_fork_in_child
_python_fork = native.fast_fork_python_fork
os.register_at_fork(before=_on_before, after_in_parent=_on_after_in_parent, after_in_child=_on_after_in_child)
