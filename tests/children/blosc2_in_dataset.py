"""A Dataset holding a blosc2 NDArray, an SChunk and a compressed buffer, all used in the parent
with 2 threads (blosc2.set_nthreads(2)); 2 workers read 6 items through them.

argv: ``torch`` or ``safeloader`` (whose DataLoader), then ``default`` (safeloader's default
options, one epoch) or ``budget2`` (thread_budget=2, persistent workers, two epochs, and the
Dataset also reads an array it does not hold: a module global). Prints the items (each with
whether its worker is a child of this process, the threads of its array and of
blosc2.nthreads), the items read in this process, every warning, then the parent's state after
the loader: an array still reads, its threads and the global's, and blosc2's live threads.
"""

import os
import sys
import time
import warnings

import blosc2
import numpy as np
import torch
from workers_left import workers_left

import safeloader
from safeloader.backends.blosc2 import _pool_threads

which, variant = sys.argv[1:]
PARENT = os.getpid()
VALUES = np.arange(60_000, dtype=np.float64).reshape(6, 10_000)

blosc2.set_nthreads(2)  # the global context's pool: 2 threads, started now
elsewhere = blosc2.asarray(VALUES * 2, chunks=(1, 10_000), blocks=(1, 1_000))  # not the Dataset's


class Blosc2Items(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.array = blosc2.asarray(VALUES, chunks=(1, 10_000), blocks=(1, 1_000))  # its own contexts: 2 threads
        self.chunks = blosc2.SChunk(chunksize=80_000, data=VALUES, cparams={"typesize": 8})
        self.packed = [blosc2.compress(row) for row in VALUES]  # decompressed with blosc2.nthreads threads

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple:
        row = self.array[index]
        chunk = np.frombuffer(self.chunks.decompress_chunk(index), dtype=np.float64)
        packed = np.frombuffer(blosc2.decompress(self.packed[index]), dtype=np.float64)
        total = float(row.sum() + chunk.sum() + packed.sum())
        if variant == "budget2":
            total += float(elsewhere[index].sum())
        forked = os.getppid() == PARENT
        return index, total, forked, self.array.schunk.dparams.nthreads, blosc2.nthreads


if __name__ == "__main__":
    dataset = Blosc2Items()
    expected = [dataset[i][:2] for i in range(6)]  # the parent's pools run: torch's workers hang on them
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if which == "torch":
            loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
            epochs = 1
        elif variant == "default":
            loader = safeloader.DataLoader(dataset, batch_size=None, num_workers=2)
            epochs = 1
        else:
            loader = safeloader.DataLoader(dataset, batch_size=None, num_workers=2, thread_budget=2,
                                           persistent_workers=True)
            epochs = 2
        for _ in range(epochs):
            print(sorted(tuple(item) for item in loader), flush=True)
        del loader
    print("EXPECTED", [(i, total) for i, total in expected])
    for warning in caught:
        if issubclass(warning.category, DeprecationWarning) and "multi-threaded" in str(warning.message):
            continue  # Python 3.12+ on any fork with live threads: torch's loader gets it too
        print(f"{warning.category.__name__}: {warning.message}")
    global_threads = blosc2.blosc2_ext.set_nthreads(2)  # the previous value: the parent's, restored
    # The pool's threads, counted once each waits in C-Blosc2: one just started may still be on its way.
    deadline = time.monotonic() + 2
    while (pool_threads := _pool_threads()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("PARENT", float(dataset.array[2].sum()) == float(VALUES[2].sum()), dataset.array.schunk.cparams.nthreads,
          dataset.array.schunk.dparams.nthreads, dataset.chunks.dparams.nthreads, global_threads, blosc2.nthreads,
          pool_threads)
    print("LEFT", len(workers_left()))
