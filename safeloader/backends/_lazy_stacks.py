"""In a worker, torch's accelerator modules note where a lazily queued call came from without reading any source
file: the stack is formatted only if it is ever read
(why: docs/internals.md, ``safeloader.backends.torch_state``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any, overload

# The modules whose ``_lazy_call`` keeps ``traceback.format_stack()`` with each call queued until
# the device is initialised (torch 2.x; each imports ``traceback`` as a module global).
MODULES = ("torch.cuda", "torch.xpu", "torch.mtia")

__all__ = ["MODULES", "FormattedStack", "format_stack", "install_in_worker"]


class FormattedStack(Sequence[str]):
    """What ``traceback.format_stack()`` returns (its lines), formatted when first read: each frame's
    file, line number and function are kept (no frame: torch avoids the reference cycle too)."""

    __slots__ = ("_frames", "_lines")

    def __init__(self, frames: list[tuple[str, int, str, None]]) -> None:
        self._frames = frames  # outermost first, as traceback lists them
        self._lines: list[str] | None = None

    def _formatted(self) -> list[str]:
        if self._lines is None:
            import traceback

            self._lines = traceback.StackSummary.from_list(self._frames).format()
        return self._lines

    def __len__(self) -> int:
        return len(self._formatted())

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        return self._formatted()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._formatted())

    def __eq__(self, other: object) -> bool:
        return self._formatted() == (list(other) if isinstance(other, FormattedStack) else other)

    __hash__ = None  # type: ignore[assignment]  # unhashable, as a list is

    def __repr__(self) -> str:
        return repr(self._formatted())


def format_stack(f: FrameType | None = None, limit: int | None = None) -> Sequence[str]:
    """``traceback.format_stack``, its lines formatted when first read (a ``limit``: at once)."""
    frame: FrameType | None = sys._getframe(1) if f is None else f
    if limit is not None:
        import traceback

        return traceback.format_stack(frame, limit)
    frames: list[tuple[str, int, str, None]] = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, None))
        frame = frame.f_back
    frames.reverse()
    return FormattedStack(frames)


class _Traceback:
    """Stands in for the ``traceback`` module in torch's accelerator modules: ``format_stack`` is
    this module's, every other name the real module's."""

    format_stack = staticmethod(format_stack)

    def __getattr__(self, name: str) -> Any:
        import traceback

        return getattr(traceback, name)


_TRACEBACK = _Traceback()  # made here, in the parent: the worker only points the modules at it


def install_in_worker() -> None:
    """In a forked worker, before torch's worker loop seeds every accelerator (``torch.manual_seed``):
    each of MODULES imported that uses the ``traceback`` module gets the stand-in (importing safeloader
    imports no ``traceback``: where it is not imported, neither are they)."""
    traceback = sys.modules.get("traceback")
    for name in MODULES:
        module = sys.modules.get(name)
        if module is not None and traceback is not None and vars(module).get("traceback") is traceback:
            module.traceback = _TRACEBACK  # type: ignore[attr-defined]
