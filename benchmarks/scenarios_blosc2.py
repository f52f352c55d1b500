"""The blosc2 scenario: a blosc2 NDArray the Dataset opens in ``__init__`` with 2 decompression threads.

Each item is a block of ``ROWS`` rows of a ``.b2nd`` file (``PARTS`` compressed chunks, each
split into blocks that C-Blosc2's threads decompress in parallel), reduced to its row sums.
The Dataset opens the array in ``__init__`` with ``dparams={"nthreads": 2}`` and the parent
reads an item first, which starts C-Blosc2's 2-thread pool. torch's forked workers then wait
forever on their first item: the pool is inherited without its threads (hung in
``pthread_cond_wait``). The usual workaround opens the array lazily in each worker (a pid check
on first use), the parent dropping its own after its read (which shuts its pool down); forkserver
and spawn need it as well (an NDArray does not pickle). Under torch's fork that workaround still
hangs, at random (its workers' first decompression waits forever in some runs, not in others,
even seconds after the parent's array was dropped and its pool's threads were gone): what
worked every time here is that and the parent's own read on 1 thread, so that no C-Blosc2 pool
of 2 threads ever ran in the parent ("1 thread in the parent"). safeloader's ``blosc2`` backend lowers
the parent's contexts to 1 thread around each worker fork and restores them after; each worker
decompresses on pools of its own, within its thread budget (cores // workers: 1 thread here).

Each measurement reports the epoch's time (``seconds``) and the time to its first batch
(``first_batch_s``).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .contenders import PRELOAD, THREADS, Measure, Setup, epoch, lazy_per_worker, loader_kinds

SHAPE = (1024, 4096)  # float32: 16 MB raw
CHUNKS = (16, 4096)  # 256 KB raw per chunk: 64 chunks
BLOCKS = (4, 4096)  # 64 KB blocks: 4 per chunk, what the threads share out
PARTS = 4  # chunks per item
ROWS = PARTS * CHUNKS[0]  # rows per item; item i reads rows of group i % GROUPS
GROUPS = SHAPE[0] // ROWS
DECOMPRESS_THREADS = 2


def write_array(directory: Path, items: int) -> dict[str, Any]:
    """A smooth float32 array as a zstd-compressed ``.b2nd`` file; the checksum of an epoch read directly."""
    import blosc2

    rng = np.random.default_rng(7)
    base = np.cumsum(rng.normal(size=SHAPE).astype(np.float32), axis=1)
    path = directory / "data.b2nd"
    blosc2.asarray(base, chunks=CHUNKS, blocks=BLOCKS, urlpath=str(path), mode="w",
                   cparams={"codec": blosc2.Codec.ZSTD, "clevel": 5, "nthreads": 1})
    # Every row group is read the same number of times per epoch.
    assert items % GROUPS == 0, items
    return {"b2nd": str(path), "blosc2_items": items,
            "blosc2_checksum": float(base.sum(dtype=np.float64)) * (items // GROUPS)}


class Blosc2Rows(Dataset):
    """Item i: the row sums of rows ``ROWS * (i % GROUPS)`` onwards, ``PARTS`` chunks of a blosc2 NDArray.

    The array is opened in ``__init__`` with 2 decompression threads and read there once (the
    natural code); ``lazy`` (the usual workaround) drops it after that read and opens it on
    first use in each process; ``parent_threads=1`` makes the parent's own read use 1 thread
    (no C-Blosc2 pool then starts in the parent).
    """

    def __init__(self, path: str, count: int, lazy: bool = False, parent_threads: int = DECOMPRESS_THREADS) -> None:
        self.path, self.count, self.lazy = path, count, lazy
        self.array: Any = self.open(parent_threads)
        self.pid: int | None = os.getpid()
        self[0]  # the parent reads first: C-Blosc2's pool starts here
        if lazy:
            self.array, self.pid = None, None
            gc.collect()  # its contexts detach: the parent's pool is shut down before any fork

    def open(self, threads: int = DECOMPRESS_THREADS) -> Any:
        import blosc2

        return blosc2.open(self.path, mode="r", dparams={"nthreads": threads})

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.lazy and self.pid != os.getpid():
            self.array, self.pid = self.open(), os.getpid()
        start = (index % GROUPS) * ROWS
        return torch.from_numpy(self.array[start:start + ROWS].sum(axis=1, dtype=np.float64))


def blosc2_contender(kind: str, lazy: bool = False, parent_threads: int = DECOMPRESS_THREADS) -> Setup:
    def setup(params: dict) -> Measure:
        dataset = Blosc2Rows(params["b2nd"], params["blosc2_items"], lazy=lazy, parent_threads=parent_threads)
        build = loader_kinds(preload=[*PRELOAD, __name__])[kind]
        return lambda: epoch(build, dataset, params["blosc2_checksum"], first_batch=True, batch_size=8,
                             num_workers=2)

    return setup


def table() -> dict[str, dict[str, Setup]]:
    return {
        "blosc2 NDArray opened in __init__, 2 threads": {
            "torch fork": blosc2_contender("torch fork"),
            **lazy_per_worker(blosc2_contender),
            "lazy per worker, 1 thread in the parent, fork": blosc2_contender("torch fork", lazy=True,
                                                                              parent_threads=1),
            **{kind: blosc2_contender(kind) for kind in ("num_workers=0", *THREADS)},
            "safeloader": blosc2_contender("safeloader"),
        }
    }
