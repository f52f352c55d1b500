"""``safeloader.doctor()`` after a parent used a library, then (for libraries safeloader handles) a
forked safeloader DataLoader using it in its workers.

argv: ``zarr`` (a zarr read with the zarrs pipeline), ``polars`` (a query), ``h5py`` (a file
left open), or ``openmp`` (a GNU OpenMP parallel region with the "threadpools" backend disabled:
workers would hang, so no loader runs). The report goes to stdout; ``WORKERS OK <items>`` to stderr.
"""

import os
import sys
import tempfile

import numpy as np
import torch
from torch.utils.data import Dataset

import safeloader

CASE = sys.argv[1]
root = tempfile.mkdtemp()


class Items(Dataset):
    def __init__(self, read):
        self.read = read

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.read(i)


if CASE == "zarr":
    import zarr
    import zarrs  # noqa: F401

    zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
    path = os.path.join(root, "a.zarr")
    zarr.create_array(path, shape=(4, 128, 128), chunks=(1, 32, 32), dtype="float32")[:] = 1.0
    array = zarr.open_array(path, mode="r")
    assert array[0:2].sum() == 2 * 128 * 128  # multi-chunk: rayon's pool, zarr's loop and executor start

    def read(i):  # the parent's array, and one opened in the worker
        return float(array[i].sum() + zarr.open_array(path, mode="r")[i, :64].sum())

    expected = [128 * 128 + 64 * 128] * 4
elif CASE == "polars":
    import polars as pl

    frame = pl.DataFrame({"a": np.arange(100_000), "b": np.arange(100_000)})
    assert frame.lazy().group_by(pl.col("a") % 7).agg(pl.col("b").sum()).collect().height == 7

    def read(i):
        return int(
            frame.lazy()
            .filter(pl.col("a") % 4 == i)
            .group_by(pl.col("a") % 3)
            .agg(pl.col("b").sum())
            .collect()["b"]
            .sum()
        )

    expected = [int(frame.filter(pl.col("a") % 4 == i)["b"].sum()) for i in range(4)]
elif CASE == "h5py":
    import h5py

    path = os.path.join(root, "f.h5")
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(40).reshape(4, 10)
    handle = h5py.File(path, "r")
    assert handle["x"][0, 0] == 0

    def read(i):
        return int(handle["x"][i].sum())

    expected = [int(np.arange(40).reshape(4, 10)[i].sum()) for i in range(4)]
elif CASE == "openmp":
    torch.set_num_threads(2)
    torch.ones(2_000_000).sum()  # a parallel region: libgomp's pool threads are live
    safeloader.configure(disable_hooks=("threadpools",))
    read = expected = None
else:
    raise SystemExit(f"unknown case {CASE!r}")

safeloader.doctor()
if read is not None:
    got = list(safeloader.DataLoader(Items(read), batch_size=None, num_workers=2, stall_timeout=30))
    assert got == expected, (got, expected)
    print("WORKERS OK", got, file=sys.stderr)
