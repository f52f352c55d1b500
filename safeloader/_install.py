"""``safeloader.install()``: arm every DataLoader in the process, and undo it exactly."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch.utils.data
import torch.utils.data.dataloader

from . import _registry, _torch_internals
from ._loader import SafeDataLoader, start_armed
from ._torch_loader_pickling import reduce_torch_loader
from .backends.pin_memory import remove_gate as remove_pin_memory_gate

_TorchDataLoader = torch.utils.data.dataloader.DataLoader
_saved: dict[str, Any] = {}


def _armed_get_iterator(self: Any) -> Any:
    return start_armed(self, lambda: _saved["get_iterator"](self))


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
    """Arm the worker forks of every torch DataLoader in this process.

    ``torch.utils.data.DataLoader`` (and ``torch.utils.data.dataloader.DataLoader``)
    become ``SafeDataLoader``; loaders built from torch's class itself, from a
    name imported before this call, or from a third-party subclass, are armed
    too. Idempotent; ``uninstall()`` restores torch exactly.
    """
    if _registry.installed():
        return Installation(owner=False)
    _saved["get_iterator"] = _torch_internals.get_iterator_of(_TorchDataLoader)
    _torch_internals.set_get_iterator(_TorchDataLoader, _armed_get_iterator)
    # pickle can no longer find torch's class by its name: reduce its instances another way.
    _saved["__reduce_ex__"] = _TorchDataLoader.__dict__.get("__reduce_ex__")
    _TorchDataLoader.__reduce_ex__ = reduce_torch_loader  # type: ignore[method-assign, assignment]
    torch.utils.data.DataLoader = SafeDataLoader  # type: ignore[misc]
    torch.utils.data.dataloader.DataLoader = SafeDataLoader  # type: ignore[misc]
    _registry.set_installed(True)
    return Installation(owner=True)


def uninstall() -> None:
    """Undo ``install()``; harmless when not installed."""
    if not _registry.installed():
        return
    _torch_internals.set_get_iterator(_TorchDataLoader, _saved.pop("get_iterator"))
    reduce_ex = _saved.pop("__reduce_ex__")
    if reduce_ex is None:
        del _TorchDataLoader.__reduce_ex__
    else:
        _TorchDataLoader.__reduce_ex__ = reduce_ex  # type: ignore[method-assign]
    torch.utils.data.DataLoader = _TorchDataLoader  # type: ignore[misc]
    torch.utils.data.dataloader.DataLoader = _TorchDataLoader  # type: ignore[misc]
    remove_pin_memory_gate()  # installed by the first armed start (backends/pin_memory.py)
    _registry.set_installed(False)


def installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _registry.installed()
