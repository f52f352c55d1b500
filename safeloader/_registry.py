"""The fork-hook dispatch, from one ``os.register_at_fork`` registration (hooks register in ``_registration``).

How it works and why: docs/internals.md, ``safeloader._registry``.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from . import _fast_fork, _fd_table, _import_locks, _loader_lock, _registration, _torch_internals, forkstate, native
from ._options import Options, get_options
from ._registration import (  # the public registration API, also reachable here
    NOTHING_TO_DO,
    PHASES,
    Callback,
    Hook,
    check_hook_names,
    disable,
    enable,
    get_hook,
    hook_runs,
    hooks,
    register_at_fork,
    unregister,
)
from .errors import HookError

T = TypeVar("T")


@dataclass(frozen=True)
class ForkContext:
    """What a hook can know about the fork it runs around: ``safeloader.fork_context()``."""

    worker_id: int
    num_workers: int
    options: Options
    loader: Any = None
    """The DataLoader starting its workers, when known."""
    watch: Any = None
    """The stall watchdog's ``Watch`` for this loader's workers, None when it is off."""
    _carrier: bool = field(default=False, repr=False)
    """True when safeloader's worker_init_fn runs in the worker and can carry errors."""


@dataclass
class Arming:
    """What the registry knows of a loader starting its workers on this thread (see ``arm``)."""

    loader: Any
    options: Options
    watch: Any = None
    """The stall watchdog's ``Watch`` for the workers, or None."""
    errors: list[HookError] = field(default_factory=list)
    recognised: int = 0
    """Forks recognised as this loader's DataLoader workers."""
    unrecognised: int = 0
    """Other forks while it started its workers (a torch whose worker loop we do not know)."""
    interrupt: BaseException | None = None
    """The first interrupt (``is_interrupt``) that landed in a fork's callbacks: raised by the loader."""
    launches: list[Any] = field(default_factory=list)
    """multiprocessing's ``Popen`` of each worker fork recognised, so that a start interrupted
    before torch kept the Process can still stop the worker (``.pid`` once forked)."""
    logging_unreleased: int = 0
    """Interrupts that landed on the first instruction of ``logging``'s at-fork release of its
    module lock, which therefore stayed held: released when the start ends."""
    start_plans: dict[str, Any] | None = None
    """The plans of the ``per_start`` hooks, made at this start's first worker fork: reused at its
    other forks while the parent's threads and loaded libraries are those recorded then."""
    start_runs: tuple[int, tuple[Hook, ...], tuple[Hook, ...], tuple[Hook, ...]] | None = None
    """(``_registration.version``, the hooks whose ``before``, ``after_in_parent`` and ``after_in_child``
    run at this start's forks), found at its first: its other forks reuse them with its plans, and
    every worker runs the third, instead of asking every registered hook again whether it runs
    (fewer objects touched, fewer pages copied: in a worker each is a page copied from the parent)."""
    holds: dict[str, Callable[[], object]] = field(default_factory=dict)
    """Hook name -> what ends what it holds for the whole start (``hold_for_start``), run by ``disarm``."""


_installed = False
_local = threading.local()  # .arming and .pending; a forked child inherits the forking thread's
_worker_context: ForkContext | None = None  # in a worker: its context, for its whole life
_child_failures: list[BaseException] = []
_child_resets: list[Callback] = []  # reset_in_child

__all__ = [
    "NOTHING_TO_DO", "PHASES", "Arming", "Callback", "ForkContext", "Hook", "arm", "armed", "check_hook_names",
    "disable", "disarm", "enable", "fork_context", "fork_memo", "get_hook", "held_for_start", "hold_for_start",
    "hook_runs", "hooks", "installed", "is_interrupt", "plan_of", "register_at_fork", "reset_in_child",
    "set_installed", "set_plan", "unregister",
]
# No lock is held around forks: a fork never waits for another thread's fork or its
# at-fork callbacks. A fork waits only for safeloader's own short work holding glibc's
# dynamic-loader lock with the GIL released (_loader_lock: enter_fork, leave_fork).
_parent_failed_fork = False  # in a child: the parent's `before` failed for this fork


_NO_FORK = object()  # _local.pending outside the hooks of a fork
# _local.plans outside a fork's hooks (never written: each fork's `before` starts a dict of its
# own). Assigning a constant, not a new dict, writes no page the workers share between forks.
_NO_PLANS: dict[str, Any] = {}


def fork_context() -> ForkContext | None:
    """The worker fork being handled: in the parent while its hooks run; in a
    worker, its own, for its whole life. None elsewhere, and around forks that
    do not start a DataLoader worker (also inside a worker)."""
    pending = getattr(_local, "pending", _NO_FORK)
    return _worker_context if pending is _NO_FORK else cast("ForkContext | None", pending)


def plan_of(name: str) -> Any:
    """In a fork's hooks on the forking thread (parent), or in the worker's: the plan that the
    backend ``name``'s ``before`` returned for this fork; None if it has none (did not run)."""
    plans = getattr(_local, "plans", _NO_PLANS)
    if name in plans:
        return plans[name]
    return getattr(_local, "start_plans", _NO_PLANS).get(name)  # a per_start plan made at an earlier fork


def set_plan(name: str, plan: Any) -> None:
    """In the backend ``name``'s ``before``: make ``plan`` this fork's plan now, before changing
    anything it must undo, so that ``after_in_parent`` gets it even if ``before`` then raises or is
    interrupted (what ``before`` returns replaces it when it completes)."""
    plans = getattr(_local, "plans", _NO_PLANS)
    if plans is not _NO_PLANS:
        plans[name] = plan


def fork_memo(key: str, make: Callable[[], T]) -> T:
    """A fact about the fork whose hooks are running, made once by the first hook to ask and seen by
    every hook of that fork, in the parent and in the worker (a value the parent makes before the fork
    is inherited). Outside a fork's hooks, ``make()`` every time. ``key``: a constant of the caller's,
    "memo:<what>" (kept beside the hooks' plans, under a name no hook has)."""
    plans = getattr(_local, "plans", _NO_PLANS)
    if plans is _NO_PLANS:
        return make()
    if key not in plans:
        plans[key] = make()
    return cast(T, plans[key])


def hold_for_start(name: str, release: Callable[[], object]) -> bool:
    """In the hook ``name``'s ``before`` at a worker fork of a start safeloader armed: keep what the
    hook holds (the pin-memory gate closed) until the start ends, instead of undoing it
    after each fork: ``release`` runs once when the start ends (``disarm``, on the
    starting thread). Register it before taking what it releases (an interrupt between the two
    must find it registered, so ``release`` must be harmless where nothing was taken). False at
    any other fork: the hook undoes it after the fork, as usual."""
    context = fork_context()
    arming = armed()
    if context is None or not context._carrier or arming is None:
        return False
    arming.holds.setdefault(name, release)
    return True


def held_for_start(name: str) -> bool:
    """Whether the hook ``name`` holds something for the start under way on this thread (``hold_for_start``)."""
    arming = getattr(_local, "arming", None)
    return arming is not None and name in arming.holds


def arm(loader: Any, options: Options, watch: Any = None) -> Arming:
    """Arm the worker forks this thread makes, until ``disarm``, as ``loader``'s, run with ``options``.

    The returned ``Arming`` collects the hooks' errors and interrupts and counts the forks
    recognised. On the main thread (the only one Python signal handlers run on), interrupts
    CPython would only report to ``sys.unraisablehook`` are deferred into it too.
    """
    global _previous_unraisablehook
    arming = Arming(loader, options, watch)
    _local.arming = arming
    if threading.current_thread() is threading.main_thread() and sys.unraisablehook is not _on_unraisable:
        _previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _on_unraisable
    return arming


def disarm(arming: Arming) -> None:
    """End the start ``arm`` began: close a fork whose ``after_in_parent`` an interrupt cut short
    (its hooks' rollback, the fork guard), give back a lock ``logging`` left held, disarm.

    Idempotent, so that a caller can run it again when an interrupt cut it short.
    """
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


def armed() -> Arming | None:
    """The ``Arming`` of the loader this thread is starting, or None."""
    return getattr(_local, "arming", None)


def installed() -> bool:
    """Whether ``safeloader.install()`` is in effect (every worker fork is armed)."""
    return _installed


def set_installed(installed: bool) -> None:
    global _installed
    _installed = installed


def _context_for_this_fork() -> ForkContext | None:
    arming = armed()
    if arming is None and not _installed:
        return None
    worker = _torch_internals.launching_worker()
    if worker is None:
        if arming is not None:
            arming.unrecognised += 1
        return None
    if arming is None:  # install() is on, but the loader's iterator is not ours to wrap
        return ForkContext(worker[0], worker[1], get_options())
    arming.recognised += 1
    if worker[2] is not None:
        arming.launches.append(worker[2])
    return ForkContext(worker[0], worker[1], arming.options, arming.loader, arming.watch, _carrier=True)


# -- dispatch ------------------------------------------------------------------


def _run_phase(
    phase: str,
    context: ForkContext | None,
    interrupts: list[BaseException],
    plans: dict[str, Any],
    planned_for_start: bool = False,
    hooks: tuple[Hook, ...] | None = None,
    start_plans: dict[str, Any] = _NO_PLANS,
) -> list[HookError]:
    """Run ``phase``'s callbacks. Their errors are returned as HookErrors; interrupts
    (``is_interrupt``; in a worker: KeyboardInterrupt or a signal handler's exception) go to
    ``interrupts``. Every hook runs either way, and an ``after_in_parent`` that was interrupted
    runs again (it rolls back its ``before``: it must complete). A backend's ``before`` returns
    its plan into ``plans``; its ``after_*`` receive it from there. ``planned_for_start``: the
    ``per_start`` hooks' plans are in ``plans`` already, and their ``before`` is not run.
    ``hooks``: exactly the hooks to run (``Arming.start_runs``), already known to run for this fork.
    ``start_plans``: the start's ``per_start`` plans where this fork did not make them (its worker)."""
    errors = []
    for hook in _registration.by_phase(phase) if hooks is None else hooks:
        callback = getattr(hook, phase)
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
                if not hook.planned:
                    callback()
                elif phase == "before":
                    plans[hook.name] = callback()
                else:
                    callback(plan)
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


def is_interrupt(exc: BaseException, *, in_worker: bool = False) -> bool:
    """Whether ``exc`` interrupts rather than fails: a BaseException that is not an Exception
    (KeyboardInterrupt, SystemExit...), or one raised by a Python signal handler (its frame is in
    the traceback). It reaches the user as itself, never as a HookError. In a worker, a hook's
    SystemExit, and a KeyboardInterrupt its own ``raise`` statement raised, stay hook failures;
    Ctrl-C to the process group (SIGINT's handler raising it) is an interrupt there too."""
    if isinstance(exc, KeyboardInterrupt):
        return not (in_worker and _raised_by_raise_statement(exc)) or _raised_by_signal_handler(exc)
    if not (in_worker or isinstance(exc, Exception)):
        return True
    return _raised_by_signal_handler(exc)


def _raised_by_raise_statement(exc: BaseException) -> bool:
    """Whether ``exc`` was first raised by a ``raise`` statement (where its traceback begins), not
    by a signal: SIGINT's default handler, written in C, raises KeyboardInterrupt where Python next
    checks for signals (a call's return, a loop's jump), never at a ``raise``."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    import opcode  # only here: an interrupt in a worker's hook is rare

    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] == opcode.opmap["RAISE_VARARGS"]


_handler_codes: frozenset[Any] = frozenset()  # the code of each Python signal handler, when last looked up


def _raised_by_signal_handler(exc: BaseException) -> bool:
    """Whether a Python signal handler's frame is in ``exc``'s traceback. Fast while the
    handlers are those of the last look-up: an interrupt storm must find its way out quickly."""
    global _handler_codes
    if exc.__traceback__ is None:
        return False
    if _in_traceback(exc, _handler_codes):
        return True
    codes = set()
    for signum in range(1, signal.NSIG):  # not signal.valid_signals(): enum conversions, 100 times slower
        try:
            handler = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
        if not callable(handler):
            continue  # SIG_DFL, SIG_IGN, or a handler installed outside Python
        function = getattr(handler, "__func__", handler)  # a bound method's function
        code = getattr(function, "__code__", None)
        if code is None:  # a callable object: its __call__
            call = type(handler).__dict__.get("__call__")  # (a class defining it)
            code = getattr(getattr(call, "__func__", call), "__code__", None)
        if code is not None:
            codes.add(code)
    _handler_codes = frozenset(codes)
    return _in_traceback(exc, _handler_codes)


def _in_traceback(exc: BaseException, codes: frozenset[Any]) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def _defer(arming: Arming, exc: BaseException) -> None:
    if arming.interrupt is None:
        arming.interrupt = exc


_LOGGING_RELEASE = ("logging", "_releaseLock")  # logging's after_in_parent at-fork callback
_previous_unraisablehook: Callable[[Any], object] = sys.unraisablehook


def _on_unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook`` during a loader start on the main thread.

    CPython reports here, then drops, an exception it cannot raise: one raised by an at-fork
    callback (os.register_at_fork's: a signal handler's exception landing on a callback's first
    instruction, before its ``try``), a ctypes callback or a ``__del__``. An interrupt reported
    while this thread starts a loader is deferred to the loader, which raises it as itself.
    """
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


def out_of_descriptors_hint(exc: BaseException) -> str:
    """A sentence to add to an error caused by running out of file descriptors, else ''."""
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return (
            ". The process ran out of file descriptors: raise the limit with `ulimit -n` in the shell "
            "(or resource.setrlimit(resource.RLIMIT_NOFILE, ...)), or use fewer workers"
        )
    return ""


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
        context = _context_for_this_fork()
        _local.pending = context
        # A start's later forks take its per_start hooks' plans as they are (no Python code of
        # theirs runs between forks: every page it wrote, the workers forked so far share).
        start = arming if arming is not None and context is not None and context._carrier else None
        start_plans = start.start_plans if start is not None else None
        planned_for_start = start_plans is not None and forkstate.unchanged_since_record()
        plans = _local.plans = {}
        # Not copied into this fork's plans: a copy writes a reference count on each plan object (pages
        # the workers forked so far share), and again when it is freed after the fork.
        _local.start_plans = start_plans if start_plans is not None and planned_for_start else _NO_PLANS
        if context is not None:
            _import_locks.name_imports_in_other_threads()  # not waited for: the worker forgets them
        interrupts: list[BaseException] = []
        runs = start.start_runs if planned_for_start and start is not None else None
        if runs is not None and runs[0] != _registration.version:
            runs = None  # a hook registered, removed, disabled or enabled since the start's first fork
        _local.after_hooks = runs[2] if runs is not None else None
        # The worker's hooks, known to the parent for this start: a worker then asks no hook whether it runs.
        _local.child_hooks = runs[3] if runs is not None else None
        errors = _run_phase("before", context, interrupts, plans, planned_for_start, runs[1] if runs else None)
        if start is not None and not planned_for_start and not errors and not interrupts:
            start.start_plans = {
                hook.name: plans[hook.name] for hook in _registration.by_phase("before")
                if hook.per_start and hook.name in plans
            }
            start.start_runs = (
                _registration.version,
                tuple(h for h in _registration.by_phase("before") if not h.per_start and h._runs_for(context)),
                tuple(h for h in _registration.by_phase("after_in_parent") if h._runs_for(context)),
                tuple(h for h in _registration.by_phase("after_in_child") if h._runs_for(context)),
            )
            _local.after_hooks, _local.child_hooks = start.start_runs[2], start.start_runs[3]
            if context is not None:  # (always: `start` is this fork's loader's)
                _fast_fork.arm(start, context, start.start_runs)
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
    context = None if context is _NO_FORK else context
    interrupts: list[BaseException] = []
    try:
        if getattr(_local, "fork_open", False):
            errors = _run_phase(
                "after_in_parent", context, interrupts, getattr(_local, "plans", _NO_PLANS), False,
                getattr(_local, "after_hooks", None),
            )
            _local.fork_open = False
            if context is not None and context._carrier and arming is not None:
                arming.errors.extend(errors)
            elif errors:
                interrupts.append(errors[0])  # raised below, for os.register_at_fork to print
    finally:
        _local.pending = _NO_FORK
        _local.plans = _local.start_plans = _NO_PLANS
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


def reset_in_child(callback: Callback) -> None:
    """Run ``callback`` first in every forked child, a DataLoader worker or any other fork: module
    state that another thread of the parent may have held at the fork (a lock) is made new there.
    For safeloader's own modules; it must not raise."""
    _child_resets.append(callback)


def _on_after_in_child() -> None:
    global _worker_context, _parent_failed_fork
    fast = _fast_in_child()
    if fast is not None:  # its parent's `before` took the C path: the rest is the start's
        contexts, fast_plans, start_plans, child_hooks = _local.fast_start
        _local.pending = contexts[fast[0]]  # the C path checked its worker id against their number
        _local.plans, _local.start_plans, _local.child_hooks = fast_plans, start_plans, child_hooks
        _local.parent_failed = False
    # _local.fast_start is left as inherited: freeing it here would write the pages of every object
    # it holds (read only after this process arms a start of its own, which sets it anew).
    _loader_lock.reset_in_child()
    for reset in _child_resets:
        reset()
    context = getattr(_local, "pending", None)
    context = None if context is _NO_FORK else context
    plans = getattr(_local, "plans", _NO_PLANS)  # both kept while the worker's hooks run (plan_of)
    start_plans = getattr(_local, "start_plans", _NO_PLANS)
    hooks = getattr(_local, "child_hooks", None)
    _local.child_hooks = None
    _local.pending = _NO_FORK
    _local.arming = None  # the child is not starting workers
    _local.fork_open = _local.fork_entered = False  # the parent closes its fork; _loader_lock is new
    _child_failures.clear()
    _worker_context = context
    _parent_failed_fork = bool(getattr(_local, "parent_failed", False))
    if context is not None:
        _import_locks.forget_imports_of_other_threads()  # before anything here imports
    if _parent_failed_fork:
        _local.plans = _local.start_plans = _NO_PLANS
        return  # the parent raises and shuts this worker down; run nothing here
    if context is not None:
        _fd_table.grow_in_worker()  # before the worker's hooks and torch start any thread
    interrupts: list[BaseException] = []
    try:
        errors: list[BaseException] = list(
            _run_phase("after_in_child", context, interrupts, plans, hooks=hooks, start_plans=start_plans)
        )
    finally:
        _local.plans = _local.start_plans = _NO_PLANS
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
