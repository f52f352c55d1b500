"""Fork hooks: registration (checked then, never at a fork), the order they run in, enabling and disabling.

``_dispatch`` runs each fork's phases over ``by_phase()``; what a hook is: ``_hook_types``, re-exported here."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from ._hook_types import NOTHING_TO_DO, PHASES, Callback, FastFork, Hook, _as_called
from ._options import Options
from .errors import RegistrationError

__all__ = [
    "NOTHING_TO_DO", "PHASES", "Callback", "FastFork", "Hook", "by_phase", "check_hook_names", "child_resets",
    "disable", "enable", "get_hook", "hook_runs", "hooks", "register_at_fork", "register_planned", "reset_in_child",
    "unregister", "version",
]


# Module state: the registry is the process's, as os.register_at_fork's is (changed under _lock).
_lock = threading.Lock()
_hooks: dict[str, Hook] = {}
_ordered: tuple[Hook, ...] = ()  # run order of the after_* phases; rebuilt on change
# Per phase, in that phase's run order, the hooks with a callback for it: a fork walks
# only those (rebuilt with _ordered).
_by_phase: dict[str, tuple[Hook, ...]] = {phase: () for phase in PHASES}
_disabled: set[str] = set()  # safeloader.disable's names; every Hook holds this set (Hook.enabled)
_next_seq = 0
version = 0
"""Bumped by every change of which hooks run (register, unregister, disable, enable): a loader
start's later forks reuse the hooks its first fork ran while it is unchanged (``_dispatch``)."""


def _names(keyword: str, value: object, what: str) -> tuple[str, ...]:
    """``value`` (one name, or an iterable of them) as a tuple of non-empty names; else RegistrationError."""
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable):
        raise RegistrationError(f"{keyword} must be a {what[:-1]} or an iterable of {what}, got {value!r}")
    names = tuple(value)
    if not all(isinstance(name, str) and name for name in names):
        raise RegistrationError(f"{keyword} must be {what} (non-empty str), got {names!r}")
    return names


def _default_name(callbacks: Iterable[Callable[..., object] | None]) -> str:
    first = next(cb for cb in callbacks if cb is not None)
    return f"{getattr(first, '__module__', '?')}.{getattr(first, '__qualname__', repr(first))}"


def register_at_fork(
    *,
    before: Callback | None = None,
    after_in_parent: Callback | None = None,
    after_in_child: Callback | None = None,
    name: str | None = None,
    first: bool = False,
    last: bool = False,
    runs_after: Iterable[str] = (),
    every_fork: bool = False,
    requires: Iterable[str] = (),
    replace: bool = False,
    description: str = "",
    priority: int | None = None,
) -> Hook:
    """Register callbacks to run around each DataLoader worker fork; returns the ``Hook``.

    ``before`` runs in the parent before each worker fork, ``after_in_parent`` in the parent after it,
    ``after_in_child`` in the new worker before torch's worker loop, each callable with no arguments
    (as for ``os.register_at_fork``) or with the fork's ``ForkContext``. ``after_*`` run in ``hooks()``
    order (``first``, then registration order, then ``last``; after the hooks named in ``runs_after``),
    ``before`` in the reverse. ``requires``: modules that must be imported for it to run;
    ``every_fork``: also around forks that are not DataLoader workers; ``priority`` is deprecated.
    Every keyword, and what an interrupt in a phase does: docs/usage.md, "Fork hooks"."""
    if priority is not None:
        first, last = _from_priority(priority, first, last)
    return _register(
        before, after_in_parent, after_in_child, name, first, last, runs_after, every_fork, requires, replace,
        description, planned=False,
    )


def _from_priority(priority: object, first: bool, last: bool) -> tuple[bool, bool]:
    """(first, last) for the deprecated ``priority`` keyword, with its DeprecationWarning."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise RegistrationError(
            f"priority must be an int, got {priority!r} (and it is deprecated: use first, last or runs_after)"
        )
    if first or last:
        raise RegistrationError("pass first/last or the deprecated priority, not both")
    taken = "first=True" if priority > 0 else "last=True" if priority < 0 else "neither first nor last"
    warnings.warn(
        f"register_at_fork(priority=...) is deprecated and will be removed in a later release; priority={priority} "
        f"is taken as {taken}. Say the order with the keywords first=True (nearest the fork), last=True "
        "(farthest from it) or runs_after=(names of the hooks this one must follow,)",
        DeprecationWarning,
        stacklevel=3,  # the caller of register_at_fork
    )
    return priority > 0, priority < 0


def register_planned(
    *,
    before: Callable[..., object] | None,
    after_in_parent: Callable[..., object] | None,
    after_in_child: Callable[..., object] | None,
    name: str,
    first: bool = False,
    last: bool = False,
    runs_after: Iterable[str] = (),
    requires: Iterable[str] = (),
    description: str = "",
    per_start: bool = False,
    fast_fork: Callable[..., Any] | None = None,
) -> Hook:
    """Register a backend's hook (``Backend.register``), replacing one of the same name: as
    ``register_at_fork``, with ``before``'s plan passed to ``after_*``; ``per_start``: one plan per
    loader start (``Hook.per_start``), so no ``after_in_parent``."""
    if not isinstance(per_start, bool):
        raise RegistrationError(f"per_start must be a bool, got {per_start!r}")
    if per_start and after_in_parent is not None:
        raise RegistrationError(
            f"hook {name!r}: per_start must be False for a hook with after_in_parent, which undoes its before "
            "at every fork"
        )
    return _register(
        before, after_in_parent, after_in_child, name, first, last, runs_after, False, requires, True,
        description, planned=True, per_start=per_start, fast_fork=fast_fork,
    )


def _register(
    before: Callable[..., object] | None,
    after_in_parent: Callable[..., object] | None,
    after_in_child: Callable[..., object] | None,
    name: str | None,
    first: bool,
    last: bool,
    runs_after: Iterable[str],
    every_fork: bool,
    requires: Iterable[str],
    replace: bool,
    description: str,
    *,
    planned: bool,
    per_start: bool = False,
    fast_fork: Callable[..., Any] | None = None,
) -> Hook:
    global _next_seq
    callbacks = {"before": before, "after_in_parent": after_in_parent, "after_in_child": after_in_child}
    for phase, callback in callbacks.items():
        _as_called(phase, callback, planned)  # refused here, with the phase's name, before anything changes
    if all(cb is None for cb in callbacks.values()):
        raise RegistrationError("register_at_fork needs at least one of before, after_in_parent, after_in_child")
    if name is None:
        name = _default_name(callbacks.values())
    if not isinstance(name, str) or not name:
        raise RegistrationError(f"name must be a non-empty str, got {name!r}")
    for keyword, flag in (("first", first), ("last", last)):
        if not isinstance(flag, bool):
            raise RegistrationError(f"{keyword} must be a bool, got {flag!r}")
    if first and last:
        raise RegistrationError("a hook can be first or last, not both")
    runs_after = _names("runs_after", runs_after, "hook names")
    if name in runs_after:
        raise RegistrationError(f"hook {name!r} cannot run after itself")
    if not isinstance(every_fork, bool):
        raise RegistrationError(f"every_fork must be a bool, got {every_fork!r}")
    if not isinstance(replace, bool):
        raise RegistrationError(f"replace must be a bool, got {replace!r}")
    if not isinstance(description, str):
        raise RegistrationError(f"description must be a str, got {description!r}")
    requires = _names("requires", requires, "module names")
    with _lock:
        if name in _hooks and not replace:
            raise RegistrationError(
                f"a fork hook named {name!r} is already registered; "
                "pass replace=True to replace it, or choose another name"
            )
        _next_seq += 1
        hook = Hook(
            name, before, after_in_parent, after_in_child, first, last, runs_after, every_fork, requires,
            description, planned, per_start, fast_fork, _next_seq, _disabled,
        )
        ordered = _ordered_hooks({**_hooks, name: hook})  # a cycle raises here, before anything changed
        _hooks[name] = hook
        _reorder(ordered)
        _changed()
    return hook


def _ordered_hooks(hooks: dict[str, Hook]) -> tuple[Hook, ...]:
    """The ``after_*`` run order: first hooks (the latest registered first: nearest the fork), then
    the others, then last hooks, each in registration order; a hook is moved after those its
    ``runs_after`` names (the earliest hook whose named hooks are all placed goes next)."""
    pending = sorted(hooks.values(), key=lambda h: (0, -h._seq) if h.first else (2 if h.last else 1, h._seq))
    placed: list[Hook] = []
    done: set[str] = set()
    while pending:
        for i, hook in enumerate(pending):
            if all(other in done or other not in hooks for other in hook.runs_after):
                placed.append(pending.pop(i))
                done.add(hook.name)
                break
        else:
            cycle = ", ".join(f"{h.name!r} runs after {list(h.runs_after)}" for h in pending)
            raise RegistrationError(f"fork hooks cannot be ordered, their runs_after form a cycle: {cycle}")
    return tuple(placed)


def _changed() -> None:
    global version
    version += 1


def _reorder(ordered: tuple[Hook, ...] | None = None) -> None:
    global _ordered, _by_phase
    _ordered = ordered if ordered is not None else _ordered_hooks(_hooks)
    by_phase = {}
    for phase in PHASES:
        order = reversed(_ordered) if phase == "before" else _ordered
        by_phase[phase] = tuple(h for h in order if getattr(h, phase) is not None)
    _by_phase = by_phase


def _lookup(hook_or_name: Hook | str) -> str:
    name = hook_or_name.name if isinstance(hook_or_name, Hook) else hook_or_name
    if name not in _hooks:
        raise KeyError(f"no fork hook named {name!r}; registered: {', '.join(_hooks) or 'none'}")
    return name


def unregister(hook_or_name: Hook | str) -> Hook:
    """Remove a hook, by handle or name; returns it. Unknown names raise KeyError."""
    with _lock:
        name = _lookup(hook_or_name)
        hook = _hooks.pop(name)
        _disabled.discard(name)
        _reorder()
        _changed()
    return hook


def hooks() -> list[Hook]:
    """Registered hooks, built-in backends included, in the order ``after_*`` run them."""
    return list(_ordered)


def get_hook(name: str) -> Hook | None:
    """The hook registered as ``name``, or None."""
    return _hooks.get(name)


def hook_runs(name: str, options: Options) -> bool:
    """Whether the hook ``name`` runs around a worker fork of a loader with ``options``:
    registered, enabled, its ``requires`` imported, and not in ``options.disable_hooks``."""
    hook = _hooks.get(name)
    return hook is not None and hook.active and name not in options.disable_hooks


def disable(hook_or_name: Hook | str) -> None:
    """Stop running a hook (a built-in backend, say) around forks, process-wide."""
    with _lock:
        _disabled.add(_lookup(hook_or_name))
        _changed()


def enable(hook_or_name: Hook | str) -> None:
    """Undo ``disable``."""
    with _lock:
        _disabled.discard(_lookup(hook_or_name))
        _changed()


def check_hook_names(names: Iterable[str]) -> None:
    """Raise ValueError for names that no registered hook has (a typo would silently run the hook)."""
    unknown = ", ".join(repr(name) for name in sorted(set(names) - set(_hooks)))
    if unknown:
        registered = ", ".join(_hooks)
        raise ValueError(f"disable_hooks must name registered hooks ({registered}), got unknown {unknown}")


def by_phase(phase: str) -> tuple[Hook, ...]:
    """The hooks with a callback for ``phase``, in that phase's run order."""
    return _by_phase[phase]


child_resets: list[Callback] = []
"""What ``reset_in_child`` registered: run first in every forked child by the dispatch."""


def reset_in_child(callback: Callback) -> None:
    """Run ``callback`` first in every forked child, a DataLoader worker or any other fork: module
    state that another thread of the parent may have held at the fork (a lock) is made new there.
    For safeloader's own modules; it must not raise."""
    child_resets.append(callback)
