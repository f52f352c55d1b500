"""Shared by ray_train.py and accelerate_train.py (imported, not run).

A Dataset as users write it: the array is opened in __init__. Item i is rows
16i..16i+16 of a 256x256 array in 64x64 chunks: a 4-chunk read.
"""

import os

import numpy as np
import torch
from torch.utils.data import Dataset

from tests.zarrs_data import expected, zarrs_pipeline


class ZarrBlocks(Dataset):
    def __init__(self, path):
        import zarr

        with zarrs_pipeline():
            self.array = zarr.open_array(path, mode="r")

    def __len__(self):
        return self.array.shape[0] // 16

    def __getitem__(self, i):
        return i, torch.from_numpy(self.array[16 * i : 16 * (i + 1)])


def matches_direct_read(indices, blocks):
    direct = expected()  # what was written: a direct read gives exactly this
    return bool(
        np.array_equal(
            blocks.numpy().reshape(-1, 256), np.concatenate([direct[16 * i : 16 * (i + 1)] for i in indices])
        )
    )


def record_armed_worker(out):
    """For an after_in_child hook: appends this worker's pid to ``out``/armed-<its parent's pid>."""
    with open(os.path.join(out, f"armed-{os.getppid()}"), "a") as f:
        f.write(f"{os.getpid()}\n")
