"""The polars scenario: the parent runs a polars query first, workers run polars per item.

The Dataset prepares its index in ``__init__`` with polars, as such Datasets do: a
group_by and a sort over all rows (1-2 million), which starts polars' thread pools in
the parent. Each item is then a small parquet file read and grouped, in the worker.
torch's forked workers hang on their first polars call (the pools were inherited without
their threads); the usual workaround is to keep polars' queries out of the training
process (``prepare_elsewhere``: the same query in a helper process) so that fork is safe.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .contenders import PRELOAD, THREADS, Measure, Setup, epoch, loader_kinds

FILES = 64
FILE_ROWS = 20_000
GROUPS = 16


def write_parquet(directory: Path, rows: int, items: int) -> dict[str, Any]:
    """``FILES`` small parquet files (columns k: group, v: value); the checksum of an epoch read directly."""
    import polars as pl

    folder = directory / "parquet"
    folder.mkdir()
    rng = np.random.default_rng(3)
    sums = []
    for i in range(FILES):
        values = rng.integers(0, 1000, FILE_ROWS)
        pl.DataFrame({"k": np.arange(FILE_ROWS) % GROUPS, "v": values}).write_parquet(folder / f"{i}.parquet")
        sums.append(int(pl.read_parquet(folder / f"{i}.parquet")["v"].sum()))
    # Items cycle through the files in the index's order: every file is read items // FILES times.
    assert items % FILES == 0, items
    return {"parquet": str(folder), "polars_rows": rows, "polars_items": items,
            "polars_checksum": float(sum(sums) * (items // FILES))}


def prepare(folder: str, rows: int) -> list[int]:
    """The Dataset's index: files ordered by a group_by/sort over ``rows`` rows (starts polars' pools)."""
    import polars as pl

    table = pl.DataFrame({"file": np.arange(rows) % FILES, "size": np.arange(rows, dtype=np.int64)})
    ranked = table.group_by("file").agg(pl.col("size").sum()).sort("size", descending=True)
    return ranked["file"].to_list()


class ParquetGroups(Dataset):
    """Item i: per-group sums of parquet file ``index[i % FILES]``, read and grouped with polars."""

    def __init__(self, folder: str, rows: int, count: int, prepare_elsewhere: bool = False) -> None:
        import polars  # noqa: F401  (imported by the parent, as a module-level import would; its pools start on use)

        self.folder, self.count = folder, count
        if prepare_elsewhere:  # the workaround: polars' pools never start in this process
            with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as helper:
                self.index = helper.submit(prepare, folder, rows).result()
        else:
            self.index = prepare(folder, rows)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        import polars as pl

        frame = pl.read_parquet(os.path.join(self.folder, f"{self.index[index % FILES]}.parquet"))
        sums = frame.group_by("k").agg(pl.col("v").sum()).sort("k")["v"]
        return torch.from_numpy(sums.to_numpy().astype(np.float64))


def polars_contender(kind: str, prepare_elsewhere: bool = False) -> Setup:
    def setup(params: dict) -> Measure:
        dataset = ParquetGroups(params["parquet"], params["polars_rows"], params["polars_items"], prepare_elsewhere)
        build = loader_kinds(preload=[*PRELOAD, "polars", __name__])[kind]
        return lambda: epoch(build, dataset, params["polars_checksum"], batch_size=8, num_workers=2)

    return setup


def table() -> dict[str, dict[str, Setup]]:
    return {
        "polars, parent ran a group_by first": {
            **{kind: polars_contender(kind) for kind in ("torch fork", "spawn", "forkserver+preload")},
            "no polars query in the parent, fork": polars_contender("torch fork", prepare_elsewhere=True),
            **{kind: polars_contender(kind) for kind in ("num_workers=0", *THREADS)},
            "safeloader": polars_contender("safeloader"),
        }
    }
