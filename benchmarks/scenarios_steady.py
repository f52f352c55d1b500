"""Training-shaped runs: persistent workers, long epochs, and a main process busy with a training step.

The suite's other scenarios time short epochs, where start-up weighs most and threads (no
start-up) win. Here each contender's loader is built once and iterated epoch after epoch
(persistent workers where it has workers), and after each batch the main process runs a
fixed "training step" of Python code that holds the GIL, as a step that launches kernels and
logs does. An epoch is then at least the steps' time; what it takes beyond that
(``loader_wait_s``) is the time the step waited for data the loader had not ready.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import Dataset

from .contenders import THREADS, Measure, Setup, loader_kinds
from .data import Records, ZarrRows

STEP_SECONDS = 0.02  # the training step, per batch
PASSES_SCALE = {"tiny": 0.01, "quick": 0.25, "full": 1.0}  # of the full run's 1024+ batches (20 s of steps)


class Passes(Dataset):
    """``dataset`` ``times`` over, so that an epoch lasts as long as a training epoch does."""

    def __init__(self, dataset: Dataset, times: int) -> None:
        self.dataset, self.times = dataset, times
        self.count = len(dataset)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.count * self.times

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index % self.count]


def train_step(seconds: float) -> None:
    """Python code for ``seconds``: it holds the GIL, letting other threads have it only at the
    interpreter's switch interval (5 ms), as a Python-heavy training step does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def steady_contender(data: str, kind: str) -> Setup:
    def setup(params: dict) -> Measure:
        if data == "zarr":
            base: Dataset = ZarrRows(params["zarr"], params["zarr_rows"])
            base[0]  # the parent's read, as in the zarr scenario
            batch, checksum = 4, params["zarr_checksum"]
        else:
            base = Records(data, params[data], params["file_items"])
            batch, checksum = 16, params["file_checksum"]
        batches = max(4, round(1024 * PASSES_SCALE[params["scale"]]))
        times = max(1, -(-batches * batch // len(base)))  # type: ignore[arg-type]
        dataset = Passes(base, times)
        kwargs: dict[str, Any] = {"batch_size": batch, "num_workers": 2}
        if kind == "safeloader" or kind.startswith("torch"):
            kwargs["persistent_workers"] = True
        loader = loader_kinds()[kind](dataset, **kwargs)

        def measure() -> dict:
            start = time.perf_counter()
            total, steps = 0.0, 0
            for batch_data in loader:
                total += float(batch_data.sum(dtype=torch.float64))
                train_step(STEP_SECONDS)
                steps += 1
            seconds = time.perf_counter() - start
            expected = checksum * times
            return {
                "seconds": seconds,
                "ok": abs(total - expected) <= 1e-6 * max(1.0, abs(expected)),
                "loader_wait_s": seconds - steps * STEP_SECONDS,
            }

        return measure

    return setup


def table() -> dict[str, dict[str, Setup]]:
    contenders = ("num_workers=0", *THREADS, "safeloader")
    return {
        f"steady state, GIL-held step per batch: {label}": {kind: steady_contender(data, kind) for kind in contenders}
        for data, label in (("zarr", "zarr via zarrs"), ("h5", "HDF5"), ("npz", "NumPy archive"))
    }
