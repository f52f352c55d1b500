"""While a loader starts on the main thread, a signal handler's exception waits for the start to end.

Ctrl-C (or any Python signal handler that raises) can land at any bytecode of a start: in
torch's code, in multiprocessing's, in ``threading``'s own bookkeeping, leaving a lock held
that the next start waits on forever. So each Python handler is wrapped for the start: it
runs when the signal comes, as always, but what it raises is kept and raised once the start
is over, undone (workers stopped) first. A second signal while one waits raises at once:
pressing Ctrl-C twice always gets out. Handlers set meanwhile, and handlers installed in C
(faulthandler), are left as they are.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any


class DeferredSignals:
    """Wraps the main thread's Python signal handlers from ``__enter__`` to ``restore()``."""

    def __init__(self) -> None:
        self.pending: BaseException | None = None
        """The first exception a handler raised meanwhile, to raise once the start is undone."""
        self._wrapped: dict[int, tuple[Any, Callable[[int, FrameType | None], Any]]] = {}
        self._active = False

    def __enter__(self) -> DeferredSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # Python runs signal handlers on the main thread only
        self._active = True
        for signum in range(1, signal.NSIG):  # not valid_signals(): enum conversions, far slower
            try:
                handler = signal.getsignal(signum)
            except ValueError:
                continue
            if callable(handler):
                wrapper = self._wrap(handler)
                try:
                    signal.signal(signum, wrapper)
                except (OSError, ValueError):
                    continue
                self._wrapped[signum] = (handler, wrapper)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Give each handler back, unless something replaced the wrapper meanwhile; idempotent."""
        self._active = False
        while self._wrapped:
            signum, (handler, wrapper) = self._wrapped.popitem()
            if signal.getsignal(signum) is wrapper:
                signal.signal(signum, handler)

    def _wrap(self, handler: Callable[[int, FrameType | None], Any]) -> Callable[[int, FrameType | None], Any]:
        def deferring(signum: int, frame: FrameType | None) -> Any:
            if not self._active or self.pending is not None:
                return handler(signum, frame)  # after the start (a chained handler), or a second signal
            try:
                return handler(signum, frame)
            except BaseException as exc:  # KeyboardInterrupt, SystemExit, a user's Timeout...
                self.pending = exc
                return None

        deferring.original = handler  # type: ignore[attr-defined]
        return deferring
