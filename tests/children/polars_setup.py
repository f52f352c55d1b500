"""Shared by the polars child scripts (imported, not run): a parent that ran a group_by on enough
rows to start polars' rayon pool, as a Dataset that prepares its data in ``__init__`` does, the
parquet files it wrote, and Datasets over both."""

import os

import numpy as np
import polars as pl
import torch  # noqa: F401
from torch.utils.data import Dataset

N = 300_000
TMP = ""  # the folder of the parquet files: set by setup()
frame = None  # the parent's DataFrame: set by setup()


def setup(tmp):
    """Start polars' pool in this process and write 4 parquet files of 1000 rows to ``tmp``."""
    global TMP, frame
    TMP = tmp
    frame = pl.DataFrame({"k": np.arange(N) % 97, "v": np.arange(N)})
    frame.group_by("k").agg(pl.col("v").sum())  # starts polars' pool in the parent
    os.makedirs(tmp, exist_ok=True)
    for i in range(4):
        frame.slice(i * 1000, 1000).write_parquet(os.path.join(tmp, f"{i}.parquet"))
    return frame


class Files(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return int(pl.read_parquet(os.path.join(TMP, f"{i}.parquet"))["v"].sum())


class Inherited(Dataset):
    # Built in __init__, used in the workers: a DataFrame, a Series, an expression, a file scan.
    def __init__(self):
        self.frame = frame
        self.series = frame["v"]
        self.expr = (pl.col("v") * 2).alias("w")
        self.scan = pl.scan_parquet(os.path.join(TMP, "*.parquet"))

    def __len__(self):
        return 4

    def __getitem__(self, i):
        part = self.frame.slice(i * 50_000, 50_000).group_by("k").agg(pl.col("v").sum()).sort("k")
        scanned = self.scan.filter(pl.col("k") == i).select(self.expr).collect()
        return [part["v"].to_list(), int(self.series[i * 7]), scanned["w"].to_list()]
