"""The shape every backend declares: one small class per native library, its state on the instance.

What it handles, when it runs and where around the fork, its phases (``before`` returns the fork's
plan, ``after_*`` receive it), ``prepare_start``, and what it tells ``doctor`` (``status``, ``hazards``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from .. import _context, _hooks
from .._context import ForkContext
from .._hooks import FastFork
from .._options import Options
from ..diagnostics import native_libraries
from ..diagnostics.native_libraries import Library
from ..errors import RegistrationError

_PHASES = ("before", "after_in_parent", "after_in_child")


@dataclass(frozen=True)
class Hazard:
    """Something live in this process that a forked worker inherits, as ``Backend.hazards`` reports it to
    ``doctor``: ``kind``, ``subject``, ``what`` say what; ``hook`` ('' the backend's, None none) makes it safe as
    ``does`` says ('' its description); else ``alone`` says who does, or ``otherwise`` what to do. ``threads``:
    the idents of the Python threads it accounts for. Field by field: docs/usage.md."""

    kind: str
    subject: str
    what: str
    hook: str | None = ""
    does: str = ""
    otherwise: str = ""
    alone: str = ""
    threads: tuple[int, ...] = ()


class Backend:
    """A native library's handling around DataLoader worker forks. Subclass it, set ``name`` and
    ``description``, override the phases you need, then ``safeloader.register_backend(YourBackend)``.

    Two threads may start workers at once: keep what one fork needs in its plan (returned by
    ``before``), not on the instance, which holds what the process knows (caches, loaded copies).
    ``status`` and ``hazards`` tell ``doctor`` how the backend stands and what it sees live.
    """

    name: ClassVar[str]
    """The fork hook's name (``disable_hooks=``, ``safeloader.disable``)."""
    description: ClassVar[str]
    """What it does for a worker, in one line (``doctor``'s hook table)."""
    requires: ClassVar[tuple[str, ...]] = ()
    """Modules that must be imported for it to run: a library the program never imported costs nothing."""
    first: ClassVar[bool] = False
    """Among the hooks nearest the fork: ``after_*`` before the plain hooks', ``before`` after theirs."""
    last: ClassVar[bool] = False
    """Among the hooks farthest from the fork: ``before`` before the plain hooks', ``after_*`` after theirs."""
    runs_after: ClassVar[tuple[str, ...]] = ()
    """Hooks whose ``after_*`` callbacks run before this one's (its ``before`` runs before theirs)."""
    libraries: ClassVar[tuple[Library | str, ...]] = ()
    """The native libraries whose threads it makes safe in each worker: a ``safeloader.Library``
    (names, how reports call it, what goes wrong without the backend), or just a file-name prefix of
    the shared objects ("libgomp") or a package name. The fork-time check, ``doctor`` and the stall
    report then count those threads as handled by this backend, not as an unknown pool."""

    plan_per_start: ClassVar[bool] = False
    """True when ``before``'s plan depends only on the loader, its options and what the parent has
    loaded and running (threads, libraries, modules), not on the worker: ``before`` then runs at a
    loader start's first fork (and again where those changed), and the start's other forks reuse
    its plan, running nothing of this backend in the parent between forks. Not with ``after_in_parent``."""

    NOTHING_TO_DO: ClassVar[Any] = _hooks.NOTHING_TO_DO
    """A plan for ``before`` to return when the worker has nothing for this backend to do and
    ``before`` changed nothing in the parent: ``after_in_child`` is then not called in that worker
    (``after_in_parent`` gets None). Each hook a worker runs costs it pages copied from the
    parent, even one that returns at once."""

    def before(self, ctx: ForkContext) -> Any:
        """In the parent, right before a worker fork: this worker's plan (any object; None for nothing)."""
        return None

    def set_plan(self, plan: Any) -> None:
        """In ``before``: make ``plan`` this fork's plan at once, so that ``after_in_parent`` can
        undo what ``before`` changes even if ``before`` then raises or is interrupted."""
        _context.set_plan(self.name, plan)

    def after_in_parent(self, ctx: ForkContext, plan: Any) -> None:
        """In the parent, right after the fork (also after a ``before`` that raised or was
        interrupted: ``plan`` is then None); undo what ``before`` changed. Must be idempotent."""

    def after_in_child(self, ctx: ForkContext, plan: Any) -> None:
        """In the new worker, before torch's worker loop: apply ``plan`` (None: ``before`` did not run)."""

    def fast_fork(self, ctx: ForkContext, plan: Any) -> FastFork | None:
        """At the fork of a start that made its plans: what the C path must do for this backend at the
        start's later forks, in its place (``FastFork``); None (the default) where ``before`` or
        ``after_in_parent`` may have work there: the start's later forks then take the Python path.
        Not asked of a ``plan_per_start`` backend, whose ``before`` runs at none of them."""
        return None

    def uncovered(self, loader: Any) -> str:
        """Why the live threads of its ``libraries`` stay a hazard for ``loader``'s forked workers
        although it runs, in a clause for the fork-time check's message; '' when it makes them safe
        (the default). For a backend that only reopens what the Dataset holds: the threads may
        serve something else (asked at a start only while such threads are live)."""
        return ""

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        """In the parent, before ``loader`` starts workers with ``start_method`` ("fork", "spawn",
        "forkserver"): checks that must fail before any worker exists, pickling support for spawn."""

    def status(self) -> str:
        """How the backend stands in this process, in words, for ``doctor``; '' for nothing to add."""
        return ""

    def hazards(self) -> Iterable[Hazard]:
        """What of its library is live in this process now that a forked worker inherits (open files,
        threads), for ``doctor``, which says for each whether its hook handles it; nothing by default.
        Called in the parent whenever doctor runs: cheap, importing nothing."""
        return ()

    def _overrides(self, phase: str) -> bool:
        return getattr(type(self), phase) is not getattr(Backend, phase)

    def has_hook(self) -> bool:
        """Whether it has a fork callback (a backend may only prepare starts)."""
        return any(self._overrides(phase) for phase in _PHASES)

    def _libraries(self) -> tuple[Library | str, ...]:
        """``libraries`` read once as a tuple (one ``Library`` or name alone too: a name's letters
        are not libraries); else RegistrationError naming the attribute."""
        value = self.libraries
        libraries = (value,) if isinstance(value, (str, Library)) else value
        if not isinstance(libraries, Iterable):
            raise RegistrationError(
                f"{type(self).__name__}.libraries must be an iterable of safeloader.Library or names, got {value!r}"
            )
        libraries = tuple(libraries)
        for library in libraries:
            if not (isinstance(library, Library) or (isinstance(library, str) and library)):
                raise RegistrationError(
                    f"{type(self).__name__}.libraries must hold safeloader.Library or non-empty names, got {library!r}"
                )
        return libraries

    def register(self) -> _hooks.Hook | None:
        """Register its fork hook and the libraries it handles; None for a backend that only prepares starts."""
        native_libraries.handled_by(self.name, self._libraries())
        if not self.has_hook():
            return None
        before, after_in_parent, after_in_child = (
            getattr(self, phase) if self._overrides(phase) else None for phase in _PHASES
        )
        return _hooks.register_planned(
            before=before,
            after_in_parent=after_in_parent,
            after_in_child=after_in_child,
            name=self.name,
            first=self.first,
            last=self.last,
            runs_after=self.runs_after,
            requires=self.requires,
            description=self.description,
            per_start=self.plan_per_start,
            fast_fork=self.fast_fork if self._overrides("fast_fork") else None,
        )
