"""``safeloader.install()``: arm every DataLoader in the process, and undo it exactly; from any thread.

How it works and why: docs/internals.md, ``safeloader._install``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch.utils.data
import torch.utils.data.dataloader

from . import _context, _torch_internals
from ._loader import SafeDataLoader, start_armed
from ._torch_loader_pickling import reduce_torch_loader
from .backends.pin_memory import remove_gate as remove_pin_memory_gate

_TorchDataLoader = torch.utils.data.dataloader.DataLoader

_lock = threading.RLock()
"""Held while ``install()``/``uninstall()`` check and patch. Re-entrant: a signal handler (or a
hook) on the thread inside one of them may call the other."""


@dataclass(frozen=True)
class _Patch:
    """What ``install()`` replaced on torch's class, for ``uninstall()`` to put back."""

    get_iterator: Callable[..., Any]
    reduce_ex: Any  # torch's class's own __reduce_ex__, None where it only inherits one


_patch: _Patch | None = None
"""In effect while installed; set and cleared under ``_lock``. Module state: torch's classes are
patched once for the whole process."""


def _armed(get_iterator: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``get_iterator`` with the worker forks armed; it keeps its own reference to it."""

    @functools.wraps(get_iterator)  # __wrapped__: found again by an install() after a half-done uninstall
    def _get_iterator(self: Any) -> Any:
        return start_armed(self, functools.partial(get_iterator, self))

    _get_iterator.__safeloader_armed__ = True  # type: ignore[attr-defined]
    return _get_iterator


def _torchs_get_iterator() -> Callable[..., Any]:
    """The ``_get_iterator`` torch's class has now, unwrapped if it is still one of ours."""
    current = _torch_internals.get_iterator_of(_TorchDataLoader)
    while getattr(current, "__safeloader_armed__", False):
        current = current.__wrapped__
    return current


class Installation:
    """Returned by ``install()``; as a context manager, uninstalls on exit
    if this call was the one that installed."""

    def __init__(self, owner: bool) -> None:
        self.owner = owner

    def __enter__(self) -> Installation:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.owner:
            uninstall()


def install() -> Installation:
    """Arm the worker forks of every torch DataLoader in this process; ``uninstall()`` restores torch.

    torch's ``DataLoader`` names become ``SafeDataLoader``; loaders of torch's own class, of a name
    imported before, or of a subclass are armed too. Idempotent and thread-safe."""
    global _patch
    with _lock:
        if _patch is not None:
            return Installation(owner=False)
        patch = _Patch(_torchs_get_iterator(), _TorchDataLoader.__dict__.get("__reduce_ex__"))
        if patch.reduce_ex is reduce_torch_loader:  # ours, left by an install() or uninstall() cut short
            patch = _Patch(patch.get_iterator, None)
        _torch_internals.set_get_iterator(_TorchDataLoader, _armed(patch.get_iterator))
        # pickle can no longer find torch's class by its name: reduce its instances another way.
        _TorchDataLoader.__reduce_ex__ = reduce_torch_loader  # type: ignore[method-assign, assignment]
        torch.utils.data.DataLoader = SafeDataLoader  # type: ignore[misc]
        torch.utils.data.dataloader.DataLoader = SafeDataLoader  # type: ignore[misc]
        _patch = patch
        _context.set_installed(True)
        return Installation(owner=True)


def uninstall() -> None:
    """Undo ``install()``; harmless when not installed. A loader start already under way in
    another thread completes, armed."""
    global _patch
    with _lock:
        patch, _patch = _patch, None  # first: an install() after this one is cut short starts afresh
        if patch is None and not _patched():
            return
        # Without a record (an install() cut short before it kept one): what is ours is undone.
        _context.set_installed(False)
        original = patch.get_iterator if patch is not None else _torchs_get_iterator()
        _torch_internals.set_get_iterator(_TorchDataLoader, original)
        reduce_ex = _TorchDataLoader.__dict__.get("__reduce_ex__")
        if patch is not None and patch.reduce_ex is not None:
            _TorchDataLoader.__reduce_ex__ = patch.reduce_ex  # type: ignore[method-assign]
        elif reduce_ex is reduce_torch_loader:
            del _TorchDataLoader.__reduce_ex__
        torch.utils.data.DataLoader = _TorchDataLoader  # type: ignore[misc]
        torch.utils.data.dataloader.DataLoader = _TorchDataLoader  # type: ignore[misc]
        remove_pin_memory_gate()  # installed by the first armed start (backends/pin_memory.py)


def _patched() -> bool:
    """Whether anything ``install()`` patches is still patched (it may have been cut short)."""
    return (
        _context.installed()
        or getattr(_torch_internals.get_iterator_of(_TorchDataLoader), "__safeloader_armed__", False)
        or _TorchDataLoader.__dict__.get("__reduce_ex__") is reduce_torch_loader
        or torch.utils.data.DataLoader is SafeDataLoader
        or torch.utils.data.dataloader.DataLoader is SafeDataLoader
    )


def installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _context.installed()
