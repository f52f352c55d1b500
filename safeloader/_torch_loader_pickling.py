"""Pickling instances of torch's own DataLoader class while ``install()`` is in effect.

Why: docs/internals.md, ``safeloader._torch_loader_pickling``."""

from __future__ import annotations

from typing import Any

import torch.utils.data.dataloader

TORCH_DATALOADER: type = torch.utils.data.dataloader.DataLoader  # imported before any install()

__all__ = ["TORCH_DATALOADER", "rebuild_torch_loader", "reduce_torch_loader"]


def rebuild_torch_loader() -> Any:
    """A bare instance of torch's DataLoader class; pickle then restores its ``__dict__``."""
    return object.__new__(TORCH_DATALOADER)


def reduce_torch_loader(self: Any, protocol: int) -> Any:
    """``__reduce_ex__`` set on torch's DataLoader class by ``install()``."""
    if type(self) is not TORCH_DATALOADER:
        return object.__reduce_ex__(self, protocol)
    return rebuild_torch_loader, (), self.__dict__
