"""The "torch" backend: CUDA the parent initialised fails clearly in a worker; torch's and numpy's generator
locks, held at the fork, are made new; lazy call stacks are formatted only if read (why: docs/internals.md)."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

from .._context import ForkContext, fork_context
from .._torch_internals import ACCELERATORS, LAZY_INIT, initialised_accelerators
from ..errors import ForkedAcceleratorError
from . import _lazy_stacks, _numpy_random_lock
from ._backend import Backend, Hazard
from ._generator_lock import DefaultGeneratorLock

NAME = "torch"

__all__ = ["BACKEND", "ACCELERATORS", "NAME", "ForkedAcceleratorError", "initialised_accelerators"]


class _RefuseLazyInit:
    """Replaces ``torch.<accelerator>._lazy_init`` in a worker forked after the parent initialised it: every use
    of the device goes through it (torch's C++ looks it up at call time)."""

    def __init__(self, accelerator: str) -> None:
        self.accelerator = accelerator

    def __call__(self) -> NoReturn:
        context = fork_context()
        worker = f"DataLoader worker {context.worker_id}" if context is not None else "A forked DataLoader worker"
        name = self.accelerator.upper() if self.accelerator == "cuda" else self.accelerator
        raise ForkedAcceleratorError(
            f"{worker} used {name}, but {name} was initialised in the parent process before the workers were "
            f"forked, and a forked process cannot use {name}. Return CPU tensors from the Dataset and move each "
            f"batch to the device in the training loop (pin_memory=True makes that copy fast). If the workers "
            f"must use {name}, pass multiprocessing_context='spawn' (each worker then starts a fresh interpreter)."
        )


class TorchBackend(Backend):
    name = NAME
    description = (
        "a worker that touches CUDA/XPU initialised in the parent gets a clear error; torch's random "
        "generator lock and numpy's global RandomState, held by another parent thread at the fork, are made "
        "new in the worker"
    )
    plan_per_start = True
    requires = ("torch",)

    def __init__(self) -> None:
        self.generator_lock = DefaultGeneratorLock()

    def before(self, ctx: ForkContext) -> tuple[str, ...]:
        """The accelerators the parent initialised: the worker refuses them."""
        self.generator_lock.address()  # found here once, in the parent: every worker inherits it
        return initialised_accelerators()

    def after_in_child(self, ctx: ForkContext, plan: tuple[str, ...] | None) -> None:
        # torch's worker loop seeds every accelerator next, each noting where the call came from by
        # reading the source of every frame: 2-3 ms and 300 pages of each worker's start, now none.
        _lazy_stacks.install_in_worker()
        self.generator_lock.release_abandoned()  # before torch's worker loop seeds the generators (docs/internals.md)
        _numpy_random_lock.release_abandoned()
        for accelerator in plan or ():
            module: Any = sys.modules.get(f"torch.{accelerator}")
            if module is not None:
                setattr(module, LAZY_INIT, _RefuseLazyInit(accelerator))

    def hazards(self) -> list[Hazard]:
        """Initialised accelerators: a forked worker cannot use them."""
        return [
            Hazard("accelerator", f"torch.{name}", f"torch.{name} is initialised: a forked worker cannot use it",
                   does=f"a worker that touches {name} raises a clear error (the parent may keep using it)",
                   otherwise=f"do not use {name} in workers")
            for name in initialised_accelerators()
        ]


BACKEND = TorchBackend()
