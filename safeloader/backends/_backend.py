"""The shape every backend declares: one small class per native library.

A backend module defines one ``Backend`` subclass saying what it handles
(``name``, ``description``), when it runs (``requires``, ``first``, ``runs_after``), what
it does in each fork phase, what it checks or prepares before a loader starts
its workers, and how it stands (for ``doctor``). ``backends.register_builtin``
registers the built-ins; ``safeloader.register_backend`` registers yours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from .. import _registry
from .._options import Options

Callback = Callable[[], object]


class Backend:
    """A native library's handling around DataLoader worker forks. Subclass it, set ``name`` and
    ``description`` and the callbacks you need, then ``safeloader.register_backend(YourBackend)``."""

    name: ClassVar[str]
    """The fork hook's name (``disable_hooks=``, ``safeloader.disable``); a constant of ``names``."""
    description: ClassVar[str]
    """What it does for a worker, in one line (``doctor``'s hook table)."""
    requires: ClassVar[tuple[str, ...]] = ()
    """Modules that must be imported for it to run: a library the program never imported costs nothing."""
    first: ClassVar[bool] = False
    """Among the hooks nearest the fork: ``after_*`` before the plain hooks', ``before`` after theirs."""
    runs_after: ClassVar[tuple[str, ...]] = ()
    """Hooks whose ``after_*`` callbacks run before this one's (its ``before`` runs before theirs)."""

    # The three phases, as for os.register_at_fork; None where there is nothing to do.
    before: ClassVar[Callback | None] = None
    after_in_parent: ClassVar[Callback | None] = None
    after_in_child: ClassVar[Callback | None] = None

    @staticmethod
    def prepare_start(loader: Any, options: Options, start_method: str) -> None:
        """In the parent, before ``loader`` starts workers with ``start_method`` ("fork", "spawn",
        "forkserver"): checks that must fail before any worker exists, pickling support for spawn."""

    @staticmethod
    def status() -> str:
        """How the backend stands in this process, in words, for ``doctor``; '' for nothing to add."""
        return ""

    @classmethod
    def has_hook(cls) -> bool:
        """Whether it has a fork callback (a backend may only prepare starts)."""
        return cls.before is not None or cls.after_in_parent is not None or cls.after_in_child is not None

    @classmethod
    def register(cls) -> _registry.Hook | None:
        """Register its fork hook; None for a backend that only prepares starts."""
        if not cls.has_hook():
            return None
        return _registry.register_at_fork(
            before=cls.before,
            after_in_parent=cls.after_in_parent,
            after_in_child=cls.after_in_child,
            name=cls.name,
            first=cls.first,
            runs_after=cls.runs_after,
            requires=cls.requires,
            description=cls.description,
            replace=True,
        )
