"""A loader start's later worker forks, recognised and checked in C (csrc/fast_fork.c).

How it works and why: docs/internals.md, ``safeloader._fast_fork``.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from typing import TYPE_CHECKING, Any

from . import _import_locks, _loader_lock, _registration, _torch_internals, forkstate, hook_names, native
from ._registration import NOTHING_TO_DO

if TYPE_CHECKING:
    from ._registry import Arming, ForkContext

# The per-fork hooks whose work at a start's later forks the C path does or knows to be none: the
# watchdog's clock and gc's pause around the fork (done by the C path), the pin-memory gate (held
# for the whole start: nothing to do after its first fork), files and sockets (nothing to do while
# no descriptor of their kind is open: checked by the C path at each fork). A start running any
# other per-fork hook forks on the Python path.
BEFORE = frozenset({hook_names.WATCHDOG, hook_names.PIN_MEMORY, hook_names.GC, hook_names.FILES, hook_names.SOCKETS})
AFTER_IN_PARENT = frozenset({hook_names.PIN_MEMORY, hook_names.GC})
HELD = (hook_names.PIN_MEMORY,)
GC_PAUSED = True
"""The gc hook's plan for a fork around which it paused gc (``backends.gc_freeze``)."""
_KINDS = {hook_names.FILES: native.READ_ONLY_FILE, hook_names.SOCKETS: native.TCP_SOCKET}


def arm(arming: Arming, context: ForkContext, runs: tuple[Any, ...]) -> bool:
    """At a start's fork that made its plans, on the Python path (called by the registry's
    ``before``, whose caller must be multiprocessing's ``Popen._launch``): arm the C path for
    the start's later forks where it can stand in for every per-fork hook. Whether it did."""
    if not native.NATIVE:
        return False
    befores = {hook.name for hook in runs[1]}
    afters = {hook.name for hook in runs[2]}
    if not befores <= BEFORE or not afters <= AFTER_IN_PARENT:
        return False
    if any(name in befores and name not in arming.holds and _would_hold(name, context) for name in HELD):
        return False  # its before at a later fork would have something to do
    record = forkstate.record_for_later_forks()
    launch = sys._getframe(2)  # this <- the registry's _on_before <- Popen._launch (os.fork is C)
    process, popen = launch.f_locals.get("process_obj"), launch.f_locals.get("self")
    target = getattr(process, "_target", None)
    positions = _torch_internals.worker_argument_positions(target) if target is not None else None
    if record is None or launch.f_code.co_name != "_launch" or popen is None or positions is None:
        return False
    thread_ids, counters, modules_state = record
    watched: list[tuple[dict[str, Any], str, Any]] = [
        (vars(_registration), "version", _registration.version),
        (vars(_loader_lock), "_released", 0),  # no dynamic-loader section runs with the GIL released
    ]
    pin_module = sys.modules.get(_torch_internals.PIN_MEMORY_MODULE)
    if pin_module is not None and "pin_memory" in vars(pin_module):
        watched.append((vars(pin_module), "pin_memory", vars(pin_module)["pin_memory"]))
    from . import watchdog

    watch = context.watch
    clock = (watch.slots, watchdog.FIELDS, watchdog.LAST) if isinstance(watch, watchdog.Watch) else None
    kinds_mask = 0
    for name in befores:
        kinds_mask |= _KINDS.get(name, 0)
    # What a worker of a fast fork is told (inherited): its context (each worker's made here, once: in
    # the worker every object made is a page copied), its plans (files and sockets had nothing to do),
    # the start's plans and the worker's hooks. Set first: a worker of the C path must find it (an
    # interrupt between the two leaves it set, and the C path unarmed).
    from ._registry import _local

    contexts = tuple(dataclasses.replace(context, worker_id=worker) for worker in range(context.num_workers))
    plans: dict[str, Any] = {name: NOTHING_TO_DO for name in befores if name in _KINDS}
    # gc: paused around each fork where the gc hook paused it around this one (its worker resumes it).
    pause_gc = hook_names.GC in befores and _local.plans.get(hook_names.GC) is GC_PAUSED
    if pause_gc:
        plans[hook_names.GC] = GC_PAUSED
    gc_between_forks = pause_gc or gc.isenabled()
    _local.fast_start = (contexts, plans, arming.start_plans, runs[3])
    armed = native.fast_fork_arm(
        thread_ids, counters, modules_state, tuple(watched), (_import_locks.MODULE_LOCKS,), kinds_mask,
        launch.f_code, target, positions, context.num_workers, arming.launches, clock,
        (gc_between_forks, pause_gc),
    )
    if not armed:
        _local.fast_start = None
    return bool(armed)


def _would_hold(name: str, context: ForkContext) -> bool:
    """Whether the hook ``name`` (one of HELD) would close something at a later fork."""
    from .backends import pin_memory

    return pin_memory.gated()
