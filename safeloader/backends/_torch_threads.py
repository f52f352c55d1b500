"""torch's thread count in a worker: the budget for torch's worker loop, and a clear error where more than one
OpenMP thread would hang (a GNU OpenMP pool of the parent's that could not be released)
(why: docs/internals.md, ``safeloader.backends.threadpools``)."""

from __future__ import annotations

import sys
from typing import Any

from .._context import fork_context
from .._torch_internals import WORKER_LOOP_MODULES as _WORKER_LOOPS  # their loops set 1 thread
from .._torch_internals import WORKER_LOOP_NAMES as _WORKER_LOOP_NAMES

__all__ = ["guard_torch_threads"]


class _TorchSetNumThreads:
    """Stands in for ``torch.set_num_threads`` in a worker: torch's worker loop's call gets the budget;
    later, more than one thread raises where the parent's GNU OpenMP pool stayed (``pinned`` says why)."""

    def __init__(self, original: Any, budget: int, pinned: str) -> None:
        self.original = original
        self.budget = budget
        self.pinned = pinned

    def __call__(self, num_threads: int) -> None:
        import torch

        caller = sys._getframe(1)
        module = caller.f_globals.get("__name__", "")
        if caller.f_code.co_name in _WORKER_LOOP_NAMES and module.startswith(_WORKER_LOOPS):
            self.original(self.budget)
            if not self.pinned:
                torch.set_num_threads = self.original  # nothing left to guard
            return
        if self.pinned and num_threads > 1:
            context = fork_context()
            worker = f"DataLoader worker {context.worker_id}" if context else "this DataLoader worker"
            raise RuntimeError(
                f"torch.set_num_threads({num_threads}) in {worker} would hang: the parent process ran an OpenMP "
                f"parallel region before forking the worker and its pool could not be released ({self.pinned}), "
                "and GNU OpenMP hangs a forked child that later runs a parallel region with more than 1 thread. "
                "torch's threads must stay at 1 here. To use more, "
                "start the workers before the parent's first multi-threaded torch op (persistent_workers=True "
                "and iterate once early), or use multiprocessing_context='spawn'."
            )
        self.original(num_threads)


def guard_torch_threads(budget: int, pinned: str) -> None:
    """Stand in for ``torch.set_num_threads`` in this worker; ``pinned``: why more than 1 thread would
    hang ('' when it would not)."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return
    original = torch.set_num_threads
    original = getattr(original, "original", original)
    torch.set_num_threads = _TorchSetNumThreads(original, budget, pinned)
