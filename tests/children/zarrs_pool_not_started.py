"""zarrs imported and configured in the parent, the array opened lazily in each worker (as the
README advises): zarrs' rayon pool never started in the parent (opening an array starts it). A
default safeloader loader's workers read through zarrs' own module, each building its pool of
``thread_budget`` threads, and the parent loads no spare copy of the extension.

argv: a directory to write the array in. Prints JSON: whether the parent loaded the spare copy, the
items' (equal to the direct read, zarrs mode, RAYON_NUM_THREADS, rayon threads started by the read).
"""

import json
import os
import sys

import numpy as np
import torch
import zarr

from safeloader import DataLoader
from safeloader.backends import zarrs as backend
from safeloader.native import thread_census
from tests.zarrs_data import CHUNKS, ZARRS_PIPELINE, expected

path = os.path.join(sys.argv[1], "plain.zarr")
array = zarr.create_array(path, shape=expected().shape, chunks=CHUNKS, dtype="f4", overwrite=True)
array[:] = expected()  # written by zarr-python's pipeline: zarrs' pool does not start

import zarrs  # noqa: E402, F401

zarr.config.set({"codec_pipeline.path": ZARRS_PIPELINE})


class Windows(torch.utils.data.Dataset):
    array = None

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        before = {tid for tid, _ in thread_census().foreign}
        if self.array is None:
            self.array = zarr.open_array(path, mode="r")
        window = np.asarray(self.array[index * 40 : index * 40 + 100, 10:250])  # 2 x 4 chunks
        started = [tid for tid, _ in thread_census().foreign if tid not in before]
        equal = bool(np.array_equal(window, expected()[index * 40 : index * 40 + 100, 10:250]))
        return equal, backend.worker_mode(), os.environ.get("RAYON_NUM_THREADS"), len(started)


loader = DataLoader(Windows(), batch_size=None, num_workers=2, thread_budget=2, timeout=30)
items = [list(item) for item in loader]
print(json.dumps({"spare loaded": backend.BACKEND.spare_copy() is not None, "items": items}))
