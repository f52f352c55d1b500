"""A loader start's later worker forks, recognised and checked in C (csrc/fast_fork.c), doing what each
per-fork hook's ``FastFork`` says; one that declares none sends them down the Python path (why: docs/internals.md)."""

from __future__ import annotations

import dataclasses
import gc
from types import FrameType
from typing import Any

from . import _hooks, _import_locks, _loader_lock, _torch_internals, forkstate, native
from ._context import Arming, ForkContext
from ._context import local as _local
from ._hooks import FastFork, Hook


def arm(arming: Arming, context: ForkContext, runs: tuple[Any, ...], launch: FrameType) -> bool:
    """At a start's fork that made its plans, on the Python path: arm the C path for the start's
    later forks where every per-fork hook declares what it needs there. ``launch``: multiprocessing's
    ``Popen._launch`` frame forking this worker. Whether it armed."""
    if not native.NATIVE:
        return False
    per_fork: dict[str, Hook] = {hook.name: hook for hook in (*runs[1], *runs[2])}
    fasts: dict[str, FastFork] = {}
    for name, hook in per_fork.items():
        fast = hook.fast_fork(context, _local.plans.get(name)) if hook.fast_fork is not None else None
        if fast is None:
            return False  # its before or after_in_parent has work at later forks
        fasts[name] = fast
    record = forkstate.record_for_later_forks(arming)
    process, popen = launch.f_locals.get("process_obj"), launch.f_locals.get("self")
    target = getattr(process, "_target", None)
    positions = _torch_internals.worker_argument_positions(target) if target is not None else None
    if record is None or launch.f_code.co_name != "_launch" or popen is None or positions is None:
        return False
    thread_ids, counters, modules_state = record
    watched: list[tuple[dict[str, Any], str, Any]] = [
        (vars(_hooks), "version", _hooks.version),
        (vars(_loader_lock), "_released", 0),  # no dynamic-loader section runs with the GIL released
    ]
    clock = None
    kinds_mask = 0
    pause_gc = False
    for fast in fasts.values():
        watched.extend(fast.watched)
        kinds_mask |= fast.descriptor_kinds
        pause_gc = pause_gc or fast.pause_gc
        clock = fast.clock if fast.clock is not None else clock
    # What a worker of a fast fork is told (inherited): its context (each worker's made here, once: in
    # the worker every object made is a page copied), its plans, the start's plans and the worker's
    # hooks. Set first: a worker of the C path must find it (an interrupt between the two leaves it
    # set, and the C path unarmed).
    contexts = tuple(dataclasses.replace(context, worker_id=worker) for worker in range(context.num_workers))
    plans = {name: fast.worker_plan for name, fast in fasts.items() if fast.worker_plan is not None}
    _local.fast_start = (contexts, plans, arming.start_plans, runs[3])
    armed = native.fast_fork_arm(
        thread_ids, counters, modules_state, tuple(watched), (_import_locks.MODULE_LOCKS,), kinds_mask,
        launch.f_code, target, positions, context.num_workers, arming.launches, clock,
        (pause_gc or gc.isenabled(), pause_gc),
    )
    if not armed:
        _local.fast_start = None
    return bool(armed)
