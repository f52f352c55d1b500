"""The suite's data sizes, and the Datasets more than one scenario module reads.

``ZarrRows`` (a zarr array decoded through zarrs) and ``Records`` (an HDF5 file or
an npz archive) are read by the short-epoch scenarios (``benchmarks.scenarios``)
and by the training-shaped ones (``benchmarks.scenarios_steady``). Datasets open
their file in ``__init__``, as users write them. Imports no scenario module.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

ZARRS_PIPELINE = "zarrs.ZarrsCodecPipeline"
PYTHON_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"

SCALES = {
    # zarr_rows x 1024 float32 columns (4 MB raw per 1024 rows), read 64 rows (4 chunks) per item;
    # polars_rows: the parent's query; polars_items: parquet files read per epoch (a multiple of 64);
    # executor_items: items of 4 zlib tiles decoded on the Dataset's ThreadPoolExecutor (a multiple of 16);
    # blosc2_items: items of 4 blosc2 chunks (a multiple of 16); pyav_items: items of 8 frames decoded
    "tiny": {"zarr_rows": 256, "file_items": 200, "blas_items": 8, "objects": 50_000, "text_items": 16,
             "polars_rows": 100_000, "polars_items": 64, "executor_items": 32,
             "blosc2_items": 32, "pyav_items": 32},
    "quick": {"zarr_rows": 32768, "file_items": 1000, "blas_items": 64, "objects": 1_000_000, "text_items": 256,
              "polars_rows": 1_500_000, "polars_items": 1024, "executor_items": 512,
              "blosc2_items": 512, "pyav_items": 512},
    "full": {"zarr_rows": 65536, "file_items": 3000, "blas_items": 192, "objects": 3_000_000, "text_items": 768,
             "polars_rows": 2_000_000, "polars_items": 3072, "executor_items": 1536,
             "blosc2_items": 1536, "pyav_items": 1536},
}


def sizes(scale: str) -> dict[str, int]:
    return SCALES[scale]


class ZarrRows(Dataset):
    """The row sums of blocks of 64 rows (one chunk row: 4 compressed chunks) of a zarr array.

    Items are reduced, as a real pipeline's crops or features are, so that the
    epoch measures decoding rather than moving raw blocks between processes.

    Opened in __init__ as users write it; ``open_in_parent=False`` opens it
    lazily in each process instead (the parent then never creates zarrs' pool).
    """

    def __init__(self, path: str, rows: int, pipeline: str = ZARRS_PIPELINE, open_in_parent: bool = True) -> None:
        self.path, self.rows, self.pipeline = path, rows, pipeline
        self.array, self.pid = (self.open(), os.getpid()) if open_in_parent else (None, None)

    def open(self) -> Any:
        import zarr

        with zarr.config.set({"codec_pipeline.path": self.pipeline}):
            return zarr.open_array(self.path, mode="r")

    def __len__(self) -> int:
        return self.rows // 64

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.array is None:
            self.array, self.pid = self.open(), os.getpid()
        return torch.from_numpy(self.array[index * 64:(index + 1) * 64].sum(axis=1, dtype=np.float64))


class Records(Dataset):
    """Record i of an HDF5 dataset or an npz archive, opened once in __init__ (the natural code)."""

    def __init__(self, fmt: str, path: str, count: int) -> None:
        self.fmt, self.path, self.count = fmt, path, count
        self.handle = self.open()
        self[0]  # the parent reads first

    def open(self):
        if self.fmt == "h5":
            import h5py

            return h5py.File(self.path, "r")
        return np.load(self.path)

    def read(self, handle, index: int) -> np.ndarray:
        return handle["x"][index] if self.fmt == "h5" else handle[f"m{index}"]

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.read(self.handle, index)))
