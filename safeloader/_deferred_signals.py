"""During a loader start on the main thread, a signal handler's exception no user code could catch waits for its end.

How it works and why: docs/internals.md, ``safeloader._deferred_signals``."""

from __future__ import annotations

import _signal  # signal's C functions: signal.getsignal/signal convert every handler to an enum
import _thread
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from . import _hooks

GRACE_SECONDS = 2.0
"""How long a signal handler's exception waits for the start's end before it is raised anyway."""


class DeferredSignals:
    """Wraps the main thread's Python signal handlers from ``__enter__`` to ``restore()``."""

    def __init__(self) -> None:
        self.pending: BaseException | None = None
        """The first exception a handler raised meanwhile, to raise once the start is undone."""
        self._wrapped: dict[int, tuple[Any, Callable[[int, FrameType | None], Any]]] = {}
        self._active = False
        self._main = 0  # the main thread's ident, where the signal is sent again after the grace

    def __enter__(self) -> DeferredSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # Python runs signal handlers on the main thread only
        self._active = True
        self._main = threading.main_thread().ident or 0
        _wrapping.append(self)
        # _signal's functions, not signal's: those convert each handler to an enum (or try to, with an
        # exception for each Python handler): 64 signals a start here, and in each worker at its fork.
        for signum in range(1, signal.NSIG):  # not valid_signals(): enum conversions, far slower
            try:
                handler = _signal.getsignal(signum)
            except ValueError:
                continue
            if callable(handler):
                wrapper = self._wrap(handler)
                try:
                    _signal.signal(signum, wrapper)
                except (OSError, ValueError):
                    continue
                self._wrapped[signum] = (handler, wrapper)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Give each handler back, unless something replaced the wrapper meanwhile; idempotent.
        A signal landing here (the grace's own) is dropped when one is pending already."""
        self._active = False
        if self in _wrapping:
            _wrapping.remove(self)
        late = None
        for _attempt in range(5):
            try:
                while self._wrapped:
                    signum, (handler, wrapper) = next(iter(self._wrapped.items()))
                    if _signal.getsignal(signum) is wrapper:
                        _signal.signal(signum, handler)
                    del self._wrapped[signum]
                break
            except BaseException as exc:  # an interrupt that landed while handlers were given back
                late = late or exc
        if late is not None and self.pending is None:
            raise late

    def give_back_in_child(self) -> None:
        """In a child forked during the start: each wrapper still in place gives way to its handler
        (no interrupt to outlast here: nothing of the start is the child's to undo)."""
        self._active = False
        for signum, (handler, wrapper) in self._wrapped.items():
            try:
                if _signal.getsignal(signum) is wrapper:
                    _signal.signal(signum, handler)
            except (OSError, ValueError):
                pass  # not the main thread's: a child of a fork from another thread
        # _wrapped is left as inherited: the start it belongs to never goes on in the child, and
        # clearing it would write the page of each handler and wrapper (copied from the parent).

    def _wrap(self, handler: Callable[[int, FrameType | None], Any]) -> Callable[[int, FrameType | None], Any]:
        kept_back_anywhere = handler is signal.default_int_handler  # Ctrl-C: nobody waits to catch it

        def deferring(signum: int, frame: FrameType | None) -> Any:
            if not self._active or self.pending is not None:
                return handler(signum, frame)  # after the start (a chained handler), or a second signal
            if not kept_back_anywhere and user_code_between(frame):
                return handler(signum, frame)  # the user's code may catch it: raised where it landed
            try:
                return handler(signum, frame)
            except BaseException as exc:  # KeyboardInterrupt, SystemExit, a user's Timeout...
                self.pending = exc
                # A raw thread: threading's own may be mid-update on this very thread (a handler runs
                # between any two bytecodes), and Thread.start would wait on its lock forever.
                _thread.start_new_thread(self._send_again_after_grace, (signum,))
                return None

        deferring.original = handler  # type: ignore[attr-defined]
        return deferring

    def _send_again_after_grace(self, signum: int) -> None:
        """In its own thread: a start still running after the grace gets the signal again, which
        the wrapper then raises at once (the start did not end: it may never)."""
        time.sleep(GRACE_SECONDS)
        if self._active:  # checked and sent without letting the GIL go: restore() cannot come between
            signal.pthread_kill(self._main, signum)


def user_code_between(frame: FrameType | None) -> bool:
    """Whether, walking out from the frame a signal interrupted to the nearest of safeloader's, a
    frame is the user's: neither safeloader's, torch's nor the standard library's (a sampler, a
    hook of the user's, a library it calls). An exception raised at ``frame`` may be caught there.
    Read only when a signal comes during a start; no safeloader frame at all: the user's."""
    while frame is not None:
        module = frame.f_globals.get("__name__")
        package = module.partition(".")[0] if isinstance(module, str) else ""
        if package == _PACKAGE:
            return False
        if package != "torch" and package not in sys.stdlib_module_names:
            return True
        frame = frame.f_back
    return True


_PACKAGE = __name__.partition(".")[0]
_wrapping: list[DeferredSignals] = []
"""The starts whose wrappers are in place (one, or nested starts on the main thread)."""


def _give_handlers_back_in_child() -> None:
    """In a forked child: the parent's starts are not the child's (a worker's SIGALRM timeout, a
    Ctrl-C, raise there at once)."""
    for signals in _wrapping:  # left in the list (popping writes their pages): given back, each is inert
        signals.give_back_in_child()


_hooks.reset_in_child(_give_handlers_back_in_child)
