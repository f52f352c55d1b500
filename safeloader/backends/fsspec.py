"""fsspec: async filesystems (HTTP, s3fs, gcsfs...) created in the parent work in forked workers
(why: docs/internals.md)."""

from __future__ import annotations

import os
import sys
from typing import Any

from .._context import ForkContext
from ._backend import Backend, Hazard

NAME = "fsspec"

def adopt_parent_filesystems() -> None:
    """In a worker: make filesystems and files from the parent rebuild themselves on first use."""
    asyn: Any = sys.modules["fsspec.asyn"]
    cls = asyn.AsyncFileSystem
    original_loop = cls.__dict__["loop"]
    if not getattr(original_loop.fget, "_safeloader", False):

        def loop(self: Any) -> Any:
            if self._pid != os.getpid():
                rebuild_in_place(self)
            return original_loop.fget(self)

        loop._safeloader = True  # type: ignore[attr-defined]
        cls.loop = property(loop)
    if not getattr(asyn.sync, "_safeloader", False):
        asyn.sync = _wrap_sync(asyn.sync)


def rebuild_in_place(fs: Any) -> None:
    """Replace the state of ``fs`` (created in another process) with a fresh instance's."""
    cls = type(fs)
    fresh = cls(*fs.storage_args, **fs.storage_options)  # fsspec's cache is per pid: a new instance
    fs.__dict__.clear()
    fs.__dict__.update(fresh.__dict__)
    token = getattr(fs, "_fs_token_", None)
    if token is not None and cls._cache.get(token) is fresh:
        cls._cache[token] = fs  # fsspec.filesystem(...) in the worker now returns the user's object


def _wrap_sync(original: Any) -> Any:
    def sync(loop: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if loop is not None and loop is BACKEND.parent_loop:
            loop = _rebind_to_worker_loop(args[0] if args else None, func)
        return original(loop, func, *args, **kwargs)

    sync._safeloader = True  # type: ignore[attr-defined]
    sync.__wrapped__ = original  # type: ignore[attr-defined]
    return sync


def _rebind_to_worker_loop(owner: Any, func: Any) -> Any:
    """Move ``owner`` (an fsspec object on the parent's loop) to this worker's loop; its loop."""
    fs = getattr(owner, "fs", None)
    if fs is not None and hasattr(fs, "set_session") and hasattr(owner, "session") and not hasattr(owner, "r"):
        loop = fs.loop  # rebuilds fs in this worker
        owner.session = sync_on(loop, fs.set_session)
        owner.loop = loop
        return loop
    name = getattr(func, "__qualname__", repr(func))
    raise RuntimeError(
        f"safeloader: {owner!r} was opened in the parent process on fsspec's event loop, which does not run in "
        f"this DataLoader worker ({name} would wait forever). Open it inside the worker (e.g. lazily on first use), "
        "or keep the filesystem in the Dataset and open files from it in __getitem__"
    )


def sync_on(loop: Any, func: Any) -> Any:
    original = sys.modules["fsspec.asyn"].sync
    return getattr(original, "__wrapped__", original)(loop, func)


class FsspecBackend(Backend):
    name = NAME
    description = 'async filesystems from the parent are rebuilt in each worker on first use (own loop and session)'
    requires = ("fsspec.asyn",)

    def __init__(self) -> None:
        self.parent_loop: Any = None
        """In a worker: the parent's fsspec event loop, which does not run here."""

    def before(self, ctx: ForkContext) -> Any:
        # Noted in the parent: fsspec's own at-fork handler forgets it in the child,
        # possibly before this hook runs.
        return sys.modules["fsspec.asyn"].loop[0]

    def after_in_child(self, ctx: ForkContext, plan: Any) -> None:
        self.parent_loop = plan
        adopt_parent_filesystems()

    def hazards(self) -> list[Hazard]:
        """fsspec's event-loop threads, which its own fork handler re-creates (so does this hook's)."""
        from . import _loop_threads

        found = _loop_threads.hazard("fsspec.asyn", "reset_after_fork", hook="")
        return [found] if found is not None else []


BACKEND = FsspecBackend()
