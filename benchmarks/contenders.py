"""The contenders every scenario module draws on: how each one builds its loader, and one timed epoch.

Process-based contenders build a DataLoader; thread-based ones (``THREADS``: a
ThreadPoolExecutor, SPDL's pipeline; ``benchmarks.threads``) iterate the same
Dataset with threads, in the scenarios where a Dataset written for workers can be
shared by threads as it is (not the first-batch ones: threads have no start-up).

A scenario maps contender names to a *setup* function (``Setup``): ``setup(params)
-> measure``, run once in the contender's own child process; ``measure()`` (``Measure``)
is then called once per round and returns ``{"seconds": float, "ok": bool}`` (plus
scenario-specific figures), or raises.

Shared by the scenario modules (``benchmarks.scenarios``, ``benchmarks.scenarios_*``);
imports none of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

import safeloader

Measure = Callable[[], dict]
Setup = Callable[[dict], Measure]
# What forkserver+preload imports in its server: torch and the module of the suite's Datasets.
PRELOAD = ["torch", "torch.utils.data", "numpy", "benchmarks.scenarios"]
THREADS = ("threads (ThreadPoolExecutor)", "threads (SPDL)")


def lazy_per_worker(contender: Callable[..., Any]) -> dict[str, Any]:
    """The usual workaround, the Dataset opening its handle lazily in each worker, under torch's fork
    loader and with forkserver and spawn: ``contender(kind, lazy=True)`` for each, by name."""
    kinds = (("torch fork", "fork"), ("forkserver+preload", "forkserver+preload"), ("spawn", "spawn"))
    return {f"lazy per worker, {label}": contender(kind, lazy=True) for kind, label in kinds}


def loader_kinds(preload: list[str] = PRELOAD) -> dict[str, Callable[..., Any]]:
    """How each contender builds its loader (an iterable of batches) from (dataset, **kwargs);
    ``preload``: what forkserver+preload imports in the server."""
    import multiprocessing

    from .threads import SpdlLoader, ThreadPoolLoader

    def with_context(method: str, with_preload: bool = False):
        def build(dataset, **kwargs):
            context = multiprocessing.get_context(method)
            if with_preload:
                context.set_forkserver_preload(preload)
            return TorchDataLoader(dataset, multiprocessing_context=context, **kwargs)

        return build

    return {
        "torch fork": TorchDataLoader,
        "spawn": with_context("spawn"),
        "forkserver": with_context("forkserver"),
        "forkserver+preload": with_context("forkserver", with_preload=True),
        "num_workers=0": lambda dataset, **kwargs: TorchDataLoader(dataset, **{**kwargs, "num_workers": 0}),
        THREADS[0]: ThreadPoolLoader,
        THREADS[1]: SpdlLoader,
        "safeloader": safeloader.DataLoader,
    }


def epoch(build: Callable[..., Any], dataset: Dataset, checksum: float | None, *, first_batch: bool = False,
          **kwargs) -> dict:
    """One epoch of the loader ``build(dataset, **kwargs)``, timed; ``ok``: its batches summed to
    ``checksum`` (None: not checked). ``first_batch``: also report the time to the first batch
    (``first_batch_s``, from the loader's creation)."""
    start = time.perf_counter()
    first: float | None = None
    total = 0.0
    for batch in build(dataset, **kwargs):
        if first_batch and first is None:
            first = time.perf_counter() - start
        total += float(batch.sum(dtype=torch.float64))
    seconds = time.perf_counter() - start
    ok = checksum is None or abs(total - checksum) <= 1e-6 * max(1.0, abs(checksum))
    return {"seconds": seconds, "ok": ok, **({"first_batch_s": first} if first_batch else {})}
