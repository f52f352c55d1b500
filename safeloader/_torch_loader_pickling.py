"""Pickling instances of torch's own DataLoader class while ``install()`` is in effect.

``install()`` rebinds ``torch.utils.data.dataloader.DataLoader`` to
``SafeDataLoader``, and pickle finds a class through its module and name: an
instance of torch's own class (built from a name imported before
``install()``, as Ray Train and HF Accelerate do) would fail to pickle with
"it's not the same object as torch.utils.data.dataloader.DataLoader", where
torch's pickles. While installed, torch's class reduces through
``rebuild_torch_loader`` instead; the state pickled, and any error (such as a
live persistent-workers iterator), are torch's own. Subclasses (SafeDataLoader
included) are found under their own names and pickle as usual.
"""

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
