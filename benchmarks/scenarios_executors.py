"""The executors scenario: a ThreadPoolExecutor the Dataset makes in ``__init__`` and uses in the parent.

Each item is ``PARTS`` compressed tiles (small zlib files of 8-bit pixels, as a tiled image or
a chunked array stores them), read, decompressed and reduced as tasks on the Dataset's own
``concurrent.futures.ThreadPoolExecutor`` (zlib and numpy let the GIL go), and the item waits on
them: Datasets fan decoding out this way. The Dataset makes its executor in ``__init__`` and
the parent reads an item first, which starts the executor's threads. torch's forked workers
then wait forever on their first item: the executor, inherited without its threads, counts
the parent's idle thread and starts none. The usual workaround makes the executor lazily in
each worker (a pid check on first use), which forkserver and spawn need as well (an executor
cannot be pickled). safeloader's ``executors`` backend lets each worker's copy of the
executor start its own threads.

Each measurement reports the epoch's time (``seconds``) and the time to its first batch
(``first_batch_s``): the loader's start-up, the workers' first executor threads included.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .contenders import PRELOAD, THREADS, Measure, Setup, epoch, lazy_per_worker, loader_kinds

CHUNKS = 64  # tile files; item i reads tiles (i * PARTS + j) % CHUNKS, j < PARTS
CHUNK_SHAPE = (256, 256)  # uint8: 64 KB raw per tile
PARTS = 4  # tiles (tasks) per item
EXECUTOR_THREADS = 2


def write_chunks(directory: Path, items: int) -> dict[str, Any]:
    """``CHUNKS`` zlib-compressed tiles of an image-like pattern; the checksum of an epoch read directly."""
    folder = directory / "chunks"
    folder.mkdir()
    rng = np.random.default_rng(4)
    y, x = np.mgrid[:CHUNK_SHAPE[0], :CHUNK_SHAPE[1]]
    sums = []
    for i in range(CHUNKS):
        # Smooth shading plus sensor noise: zlib makes about 1.3:1 of it, as of photographs.
        shade = 128 + 60 * np.sin(x / 17 + rng.uniform(0, 6)) * np.cos(y / 23) + rng.normal(0, 3, CHUNK_SHAPE)
        chunk = shade.clip(0, 255).astype(np.uint8)
        (folder / f"{i}.z").write_bytes(zlib.compress(chunk.tobytes(), 6))
        sums.append(float(chunk.sum(dtype=np.float64)))
    # Every chunk is read the same number of times per epoch.
    assert items * PARTS % CHUNKS == 0, items
    return {"chunks": str(folder), "executor_items": items,
            "executor_checksum": sum(sums) * (items * PARTS // CHUNKS)}


def decode(path: str) -> np.ndarray:
    """One task: read a tile, decompress it, reduce it to its row sums."""
    with open(path, "rb") as f:
        raw = zlib.decompress(f.read())
    return np.frombuffer(raw, np.uint8).reshape(CHUNK_SHAPE).sum(axis=1, dtype=np.float64)


class DecodesOnItsExecutor(Dataset):
    """Item i: the summed row sums of ``PARTS`` tiles, decoded as tasks on the Dataset's executor.

    The executor is made in ``__init__`` and used there once (the natural code); ``lazy``
    (the usual workaround) drops it after that read and makes one on first use in each process.
    """

    def __init__(self, folder: str, count: int, lazy: bool = False) -> None:
        self.folder, self.count, self.lazy = folder, count, lazy
        self.executor: ThreadPoolExecutor | None = ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="decode")
        self.pid: int | None = os.getpid()
        self[0]  # the parent reads first: the executor's threads start here
        if lazy:
            assert self.executor is not None
            self.executor.shutdown()
            self.executor, self.pid = None, None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.lazy and self.pid != os.getpid():
            self.executor = ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="decode")
            self.pid = os.getpid()
        assert self.executor is not None
        paths = [os.path.join(self.folder, f"{(index * PARTS + j) % CHUNKS}.z") for j in range(PARTS)]
        futures = [self.executor.submit(decode, path) for path in paths]
        return torch.from_numpy(sum(future.result() for future in futures))


def executor_contender(kind: str, lazy: bool = False) -> Setup:
    def setup(params: dict) -> Measure:
        dataset = DecodesOnItsExecutor(params["chunks"], params["executor_items"], lazy=lazy)
        build = loader_kinds(preload=[*PRELOAD, __name__])[kind]
        return lambda: epoch(build, dataset, params["executor_checksum"], first_batch=True, batch_size=8,
                             num_workers=2)

    return setup


def table() -> dict[str, dict[str, Setup]]:
    return {
        "ThreadPoolExecutor made in __init__, tasks per item": {
            "torch fork": executor_contender("torch fork"),
            **lazy_per_worker(executor_contender),
            **{kind: executor_contender(kind) for kind in ("num_workers=0", *THREADS)},
            "safeloader": executor_contender("safeloader"),
        }
    }
