"""What a fork hook is: ``Hook``, ``FastFork`` (what the C path does in its place), ``NOTHING_TO_DO``, and
the shapes a phase's callback may take; the registry is ``_hooks``."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import RegistrationError

if TYPE_CHECKING:
    from ._context import ForkContext

PHASES = ("before", "after_in_parent", "after_in_child")

Callback = Callable[[], object]


class _NothingToDo:
    __slots__ = ()

    def __repr__(self) -> str:
        return "safeloader.NOTHING_TO_DO"


NOTHING_TO_DO: Any = _NothingToDo()
"""The plan a backend's ``before`` returns when this fork's worker has nothing for it to do: its
``after_in_child`` is then not called in that worker (``after_in_parent`` gets None). A worker
pays for every hook it runs in pages copied from its parent, even for one that returns at once."""


@dataclass(frozen=True)
class FastFork:
    """What a per-fork hook's ``fast_fork(ctx, plan)`` declares: at a loader start's later forks the
    C path (``_fast_fork``) stands in for its ``before`` and ``after_in_parent``, doing only this."""

    worker_plan: Any = None
    """The plan its ``after_in_child`` gets in the workers of those forks (``NOTHING_TO_DO``: not called)."""
    descriptor_kinds: int = 0
    """``native`` descriptor kinds (``READ_ONLY_FILE``, ``TCP_SOCKET``): a fork where one is open
    takes the Python path, which runs the hook."""
    clock: tuple[Any, int, int] | None = None
    """(slots, fields, index): the C path writes the fork's time at ``slots[worker * fields + index]``."""
    pause_gc: bool = False
    """The C path pauses the garbage collector around each fork (the worker's plan resumes it)."""
    watched: tuple[tuple[dict[str, Any], str, Any], ...] = ()
    """(namespace, key, value) that must stay as they are: a change sends the fork to the Python path."""


@dataclass(frozen=True, eq=False)
class Hook:
    """A registered set of fork callbacks. Returned by ``register_at_fork``."""

    name: str
    before: Callable[..., object] | None = None
    after_in_parent: Callable[..., object] | None = None
    after_in_child: Callable[..., object] | None = None
    first: bool = False
    """Innermost around the fork: its ``before`` runs after every other hook's, its ``after_*`` first."""
    last: bool = False
    """Outermost: its ``before`` runs first, its ``after_*`` after every other hook's."""
    runs_after: tuple[str, ...] = ()
    """Hooks (by name, where registered) whose ``after_*`` callbacks run before this one's, and whose
    ``before`` runs after this one's: it relies on what they set up in the worker."""
    every_fork: bool = False
    requires: tuple[str, ...] = ()
    """Module names that must be imported (in ``sys.modules``) for the hook to run."""
    description: str = ""
    """What it does, in one line (``python -m safeloader doctor`` lists it)."""
    planned: bool = False
    """A backend's hook (``register_planned``): what ``before`` returns, the fork's plan, is passed
    to its ``after_in_parent`` and ``after_in_child`` (None where ``before`` did not run or raised)."""
    per_start: bool = False
    """Its plan holds for a whole loader start: ``before`` runs at the start's first fork, and again
    only at a fork where the parent's threads or loaded libraries changed; the other forks reuse
    that plan and run nothing of the hook in the parent (``register_planned``)."""
    fast_fork: Callable[..., Any] | None = None
    """How the C path stands in for this per-fork hook at a start's later forks (``_fast_fork``):
    ``fast_fork(ctx, plan)`` -> a ``FastFork`` or None (it cannot: those forks take the Python path)."""
    _seq: int = field(default=0, repr=False)
    _disabled: Set[str] = field(default=frozenset(), repr=False)
    """The registry's names turned off by ``safeloader.disable``: the set itself, shared by every hook
    it registered (``_hooks``), read at each fork."""
    _calls: dict[str, Any] = field(init=False, repr=False)
    """Each phase's callback as the dispatch calls it: ``before(ctx)``, ``after_*(ctx, plan)``."""

    def __post_init__(self) -> None:
        # Made here, not passed in: dataclasses.replace() with another callback makes them anew.
        calls = {phase: _as_called(phase, getattr(self, phase), self.planned) for phase in PHASES}
        object.__setattr__(self, "_calls", calls)

    @property
    def enabled(self) -> bool:
        """False after ``safeloader.disable(name)``."""
        return self.name not in self._disabled

    @property
    def active(self) -> bool:
        """Whether the hook would run around the next worker fork."""
        if not self.enabled:
            return False
        for module in self.requires:  # a loop, not all(...): this runs for every hook at every fork
            if module not in sys.modules:
                return False
        return True

    def _runs_for(self, context: ForkContext | None) -> bool:
        if not self.active:
            return False
        if context is None:
            return self.every_fork
        return self.name not in context.options.disable_hooks


# The shapes a phase's callback may take, the dispatch's own first, and how an error says them: a
# backend's (planned) phases get the fork's context and plan; os.register_at_fork's shape (no
# arguments) stays accepted. Key: (planned, an after_* phase).
_OS_SHAPE = ((), ("ctx",)), "no arguments (as for os.register_at_fork) or one, the fork's context"
_SHAPES = {
    (True, False): ((("ctx",), ()), "no arguments or one, the fork's context"),
    (True, True): ((("ctx", "plan"), ("plan",)), "one argument, the fork's plan, or two: (ctx, plan)"),
    (False, False): _OS_SHAPE,
    (False, True): _OS_SHAPE,
}


def _as_called(phase: str, callback: object, planned: bool = False) -> Callable[..., object] | None:
    """``callback`` as the dispatch calls it, ``before(ctx)`` and ``after_*(ctx, plan)``; None for
    None. RegistrationError where it is not callable in one of its phase's shapes."""
    if callback is None:
        return None
    if not callable(callback):
        raise RegistrationError(f"{phase} must be callable or None, got {callback!r}")
    shapes, expected = _SHAPES[planned, phase != "before"]
    try:
        signature = inspect.signature(callback)
    except ValueError:  # builtins without a signature: taken in the shape os.register_at_fork gives
        shape = shapes[-1] if planned else ()
    else:
        for shape in shapes:
            try:
                signature.bind(*shape)
                break
            except TypeError:
                continue
        else:
            raise RegistrationError(
                f"{phase} must be callable with {expected}, got {callback!r} with signature {signature}"
            ) from None
    function: Callable[..., object] = callback
    if phase == "before":
        return function if shape else lambda ctx: function()
    if len(shape) == 2:
        return function
    if shape == ("plan",):
        return lambda ctx, plan: function(plan)
    return (lambda ctx, plan: function(ctx)) if shape else (lambda ctx, plan: function())
