"""What a fork's hooks are handed: its ``ForkContext``, and the loader start (``Arming``) it belongs to; the
per-fork store behind ``set_plan`` and ``memo`` (why a thread-local: docs/internals.md, ``safeloader._dispatch``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from ._options import Options

T = TypeVar("T")


@dataclass
class Arming:
    """A loader starting its workers on this thread (``_dispatch.arm``): what its forks share."""

    loader: Any
    options: Options
    watch: Any = None
    """The stall watchdog's ``Watch`` for the workers, or None."""
    errors: list[BaseException] = field(default_factory=list)
    recognised: int = 0
    """Forks recognised as this loader's DataLoader workers."""
    unrecognised: int = 0
    """Other forks while it started its workers (a torch whose worker loop we do not know)."""
    interrupt: BaseException | None = None
    """The first interrupt that landed in a fork's callbacks: raised by the loader."""
    launches: list[Any] = field(default_factory=list)
    """multiprocessing's ``Popen`` of each worker fork recognised (``.pid`` once forked)."""
    logging_unreleased: int = 0
    """Interrupts that cut ``logging``'s at-fork release of its lock short: released at the end."""
    start_plans: dict[str, Any] | None = None
    """The ``per_start`` hooks' plans, made at this start's first worker fork."""
    start_runs: tuple[int, tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]] | None = None
    """(``_hooks.version``, the hooks whose ``before``, ``after_in_parent`` and ``after_in_child`` run
    at this start's forks), found at its first fork and reused at the others."""
    holds: dict[str, Callable[[], object]] = field(default_factory=dict)
    """Hook name -> what ends what it holds for the whole start (``hold_for_start``)."""
    forks: Any = None
    """``forkstate``'s record of the parent at this start's forks (reused from fork to fork)."""


@dataclass(frozen=True)
class ForkContext:
    """What a hook knows of the fork it runs around; handed to every phase, ``safeloader.fork_context()`` too."""

    worker_id: int
    num_workers: int
    options: Options
    loader: Any = None
    """The DataLoader starting its workers, when known."""
    watch: Any = None
    """The stall watchdog's ``Watch`` for this loader's workers, None when it is off."""
    start: Arming | None = field(default=None, repr=False, compare=False)
    """The start safeloader armed (None under ``install()`` for a loader whose iterator is not ours)."""

    @property
    def _carrier(self) -> bool:
        """Whether safeloader's worker_init_fn runs in the worker and can carry errors to the parent."""
        return self.start is not None

    def set_plan(self, name: str, plan: Any) -> None:
        """In the hook ``name``'s ``before``: make ``plan`` this fork's plan now, before changing what
        it must undo, so that ``after_in_parent`` gets it even if ``before`` then fails."""
        set_plan(name, plan)

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """A fact about this fork made once by the first hook to ask (``fork_memo``)."""
        return fork_memo(key, make)

    def hold_for_start(self, name: str, release: Callable[[], object]) -> bool:
        """Keep what the hook ``name`` holds until the start ends (``release`` then runs once), instead
        of undoing it after each fork. Register before taking what it releases. False where this fork
        is not part of a start safeloader armed: the hook undoes it after the fork, as usual."""
        arming = self.start
        if arming is None or arming is not armed():
            return False
        arming.holds.setdefault(name, release)
        return True


# The fork under way on this thread (pending, plans, start_plans) and its start (arming); a forked
# child inherits the forking thread's. Written only by _dispatch.
local = threading.local()
NO_FORK: Any = object()
"""``local.pending`` outside a fork's hooks."""
NO_PLANS: dict[str, Any] = {}
"""``local.plans`` outside a fork's hooks. A constant, not a new dict: no page the workers share is written."""
worker: ForkContext | None = None
"""In a DataLoader worker: its context, for its whole life (set by ``_dispatch`` in the child)."""
_installed = False  # module state: install() arms every loader of the process


def fork_context() -> ForkContext | None:
    """The worker fork being handled: in the parent while its hooks run; in a worker, its own, for
    its whole life. None elsewhere, and around forks that do not start a DataLoader worker."""
    pending = getattr(local, "pending", NO_FORK)
    return worker if pending is NO_FORK else cast("ForkContext | None", pending)


def armed() -> Arming | None:
    """The ``Arming`` of the loader this thread is starting, or None."""
    return getattr(local, "arming", None)


def installed() -> bool:
    """Whether ``safeloader.install()`` is in effect (every worker fork is armed)."""
    return _installed


def set_installed(value: bool) -> None:
    global _installed
    _installed = value


def plan_of(name: str) -> Any:
    """In a fork's hooks (parent or worker): the plan the hook ``name``'s ``before`` made; None if none."""
    plans = getattr(local, "plans", NO_PLANS)
    if name in plans:
        return plans[name]
    return getattr(local, "start_plans", NO_PLANS).get(name)


def set_plan(name: str, plan: Any) -> None:
    """``ForkContext.set_plan`` (and ``Backend.set_plan``, which knows its name)."""
    plans = getattr(local, "plans", NO_PLANS)
    if plans is not NO_PLANS:
        plans[name] = plan


def fork_memo(key: str, make: Callable[[], T]) -> T:
    """A fact about the fork whose hooks run, made once by the first hook to ask and seen by every
    hook of that fork, in the parent and in the worker. Outside a fork's hooks, ``make()`` every time.
    ``key``: a constant of the caller's, "memo:<what>" (kept beside the plans, under no hook's name)."""
    plans = getattr(local, "plans", NO_PLANS)
    if plans is NO_PLANS:
        return make()
    if key not in plans:
        plans[key] = make()
    return cast(T, plans[key])


def held_for_start(name: str) -> bool:
    """Whether the hook ``name`` holds something for the start under way on this thread."""
    arming = armed()
    return arming is not None and name in arming.holds
