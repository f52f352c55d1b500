"""The suite's registry of scenarios (``scenarios()``, ``make_data``), and its short-epoch scenarios.

Each scenario maps contender names to a *setup* function ``setup(params) ->
measure``; the runner calls setup once in a fresh child process (so a parent
state such as "zarrs already decoded here" is real) and then ``measure()``
once per round. ``measure`` returns ``{"seconds": float, "ok": bool}`` (plus
scenario-specific figures), or raises: an exception is recorded as a failure,
a timeout as a hang.

How each contender loads (torch's start methods, threads, safeloader) is
``benchmarks.contenders``; the data sizes and the Datasets several scenario
modules share are ``benchmarks.data``. The scenarios defined here are start-up,
zarr, HDF5/npz, BLAS, Python-heavy and worker memory; the others live in the
``benchmarks.scenarios_*`` modules, which import only those shared modules:
this module is the one that imports every scenario module.

Datasets open their file in ``__init__``, as users write them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from . import (
    scenarios_blosc2,
    scenarios_executors,
    scenarios_handles,
    scenarios_polars,
    scenarios_pyav,
    scenarios_steady,
)
from .contenders import THREADS, Measure, Setup, epoch, loader_kinds
from .data import PYTHON_PIPELINE, ZARRS_PIPELINE, Records, ZarrRows, sizes

SLOW_STARTS = ("spawn", "forkserver", "forkserver+preload")


# -- data ----------------------------------------------------------------------


def make_data(directory: Path, scale: str) -> dict[str, Any]:
    """Write every scenario's files once; returns the params children get."""
    import h5py
    import zarr
    import zarrs  # noqa: F401
    from zarr.codecs import BloscCodec

    n = sizes(scale)
    rng = np.random.default_rng(0)
    # Smooth data compresses like real images do, so decoding dominates the read.
    rows = n["zarr_rows"]
    base = np.cumsum(rng.normal(size=(rows, 1024)).astype(np.float32), axis=1)
    with zarr.config.set({"codec_pipeline.path": ZARRS_PIPELINE}):
        array = zarr.create_array(directory / "data.zarr", shape=base.shape, chunks=(64, 256), dtype="f4",
                                  compressors=BloscCodec(cname="zstd", clevel=5), overwrite=True)
        array[:] = base
    records = rng.integers(0, 256, (n["file_items"], 512), dtype=np.uint8)
    with h5py.File(directory / "data.h5", "w") as f:
        f.create_dataset("x", data=records, chunks=(8, 512), compression="gzip")
    np.savez(directory / "data.npz", **{f"m{i}": records[i] for i in range(n["file_items"])})

    return {
        "lmdb": scenarios_handles.write_lmdb(directory, records),
        **scenarios_polars.write_parquet(directory, n["polars_rows"], n["polars_items"]),
        **scenarios_executors.write_chunks(directory, n["executor_items"]),
        **scenarios_blosc2.write_array(directory, n["blosc2_items"]),
        **scenarios_pyav.write_video(directory, n["pyav_items"]),
        "text_checksum": float(sum(Tokenize(n["text_items"])[i] for i in range(n["text_items"]))),
        "dir": str(directory),
        "zarr": str(directory / "data.zarr"),
        "zarr_checksum": float(base.sum(dtype=np.float64)),
        "h5": str(directory / "data.h5"),
        "npz": str(directory / "data.npz"),
        "file_checksum": int(records.sum(dtype=np.int64)),
        "scale": scale,
        **n,
    }


# -- start-up ------------------------------------------------------------------


class Trivial(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def startup(kind: str, workers: int) -> Setup:
    def setup(params: dict) -> Measure:
        build = loader_kinds()[kind]

        def measure() -> dict:
            start = time.perf_counter()
            iterator = iter(build(Trivial(), batch_size=8, num_workers=workers))
            ok = next(iterator).tolist() == list(range(8))
            seconds = time.perf_counter() - start
            del iterator
            return {"seconds": seconds, "ok": ok}

        return measure

    return setup


# -- zarr through zarrs ----------------------------------------------------------


def zarr_contender(kind: str, parent_reads: bool = True, pipeline: str = ZARRS_PIPELINE) -> Setup:
    def setup(params: dict) -> Measure:
        dataset = ZarrRows(params["zarr"], params["zarr_rows"], pipeline, open_in_parent=parent_reads)
        if parent_reads:
            dataset[0]  # a sanity read in the parent: arms the zarrs deadlock
        build = loader_kinds()[kind]
        return lambda: epoch(build, dataset, params["zarr_checksum"], batch_size=4, num_workers=2)

    return setup


# -- HDF5 and npz --------------------------------------------------------------


class OpenPerItem(Records):
    """Workaround 1: open the file in every __getitem__."""

    def __getitem__(self, index: int) -> torch.Tensor:
        handle = self.open()
        try:
            return torch.from_numpy(np.asarray(self.read(handle, index)))
        finally:
            handle.close()


class LazyPerWorker(Records):
    """Workaround 2: open lazily, once per worker (the seed document's fix)."""

    def __init__(self, fmt: str, path: str, count: int) -> None:
        self.pid = None
        super().__init__(fmt, path, count)
        self.handle.close()  # only the parent's first read used it
        self.handle, self.pid = None, None

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.pid != os.getpid():
            self.handle, self.pid = self.open(), os.getpid()
        return torch.from_numpy(np.asarray(self.read(self.handle, index)))


def file_contender(fmt: str, kind: str, dataset_class: type = Records) -> Setup:
    def setup(params: dict) -> Measure:
        dataset = dataset_class(fmt, params[fmt], params["file_items"])
        build = loader_kinds()[kind]
        generator = torch.Generator().manual_seed(0)
        return lambda: epoch(build, dataset, params["file_checksum"], batch_size=16, num_workers=2, shuffle=True,
                             generator=generator)

    return setup


# -- BLAS in __getitem__ ---------------------------------------------------------


class Matmul(Dataset):
    def __init__(self, count: int) -> None:
        self.count = count
        self.matrix = np.random.default_rng(1).standard_normal((384, 384))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        product = self.matrix
        for _ in range(4):
            product = product @ self.matrix / 20.0
        return torch.tensor(float(np.abs(product).sum()))


def blas_contender(kind: str) -> Setup:
    def setup(params: dict) -> Measure:
        dataset = Matmul(params["blas_items"])
        build = loader_kinds()[kind]
        return lambda: epoch(build, dataset, None, batch_size=4, num_workers=2)

    return setup


# -- Python-heavy transform ---------------------------------------------------------


class Tokenize(Dataset):
    """Pure-Python work per item (splitting, normalising and counting the words of a document, as
    text pipelines do): it holds the GIL throughout, so threads run it one at a time."""

    WORDS = tuple(f"Word{i}," if i % 7 == 0 else f"word{i}" for i in range(2000))

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        words, step = self.WORDS, 1 + index % 13
        text = " ".join(words[(index + j * step) % len(words)] for j in range(20_000))
        counts: dict[str, int] = {}
        for word in text.split():
            token = word.lower().strip(".,")
            counts[token] = counts.get(token, 0) + 1
        return torch.tensor(float(sum(len(token) * n for token, n in counts.items()) + len(counts)))


def text_contender(kind: str) -> Setup:
    def setup(params: dict) -> Measure:
        dataset = Tokenize(params["text_items"])
        build = loader_kinds()[kind]
        return lambda: epoch(build, dataset, params["text_checksum"], batch_size=4, num_workers=2)

    return setup


# -- worker memory ----------------------------------------------------------------


class ManyObjects(Dataset):
    """Millions of small Python objects: forked workers copy the pages their GC writes to.

    Each worker runs one full collection at its first item, as a long-running
    worker eventually does (or as libraries calling ``gc.collect()`` do).
    """

    def __init__(self, count: int) -> None:
        self.items = [{"id": i, "label": str(i % 1000), "box": [i, i + 1.0]} for i in range(count)]
        self.collected_in: int | None = os.getpid()

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.collected_in != os.getpid():
            import gc

            gc.collect()
            self.collected_in = os.getpid()
        item = self.items[(index * 7919) % len(self.items)]
        return torch.tensor(item["id"])


def memory_contender(kind: str, **loader_kwargs: Any) -> Setup:
    def setup(params: dict) -> Measure:
        import psutil

        dataset = ManyObjects(params["objects"])
        build = loader_kinds()[kind]

        def measure() -> dict:
            start = time.perf_counter()
            loader = build(dataset, batch_size=8, num_workers=2, persistent_workers=True, **loader_kwargs)
            for _ in loader:
                pass
            workers = psutil.Process().children()
            uss = [w.memory_full_info().uss for w in workers if "resource_tracker" not in " ".join(w.cmdline())
                   and "forkserver" not in " ".join(w.cmdline())]
            seconds = time.perf_counter() - start
            del loader
            return {"seconds": seconds, "ok": True, "worker_uss_mb": sum(uss) / len(uss) / 2**20 if uss else None}

        return measure

    return setup


# -- the table of scenarios -----------------------------------------------------------


def scenarios() -> dict[str, dict[str, Setup]]:
    """scenario -> contender -> setup. Every scenario has a "safeloader" contender (the ratio base)."""
    table: dict[str, dict[str, Setup]] = {}
    for workers in (1, 2, 4):
        table[f"first batch, {workers} worker{'s' if workers > 1 else ''}"] = {
            kind: startup(kind, workers) for kind in loader_kinds() if kind not in ("num_workers=0", *THREADS)
        }
    table["zarr via zarrs, parent read first"] = {
        "torch fork": zarr_contender("torch fork"),
        "torch fork, parent never opened it": zarr_contender("torch fork", parent_reads=False),
        **{kind: zarr_contender(kind) for kind in (*SLOW_STARTS, "num_workers=0", *THREADS)},
        "zarr-python pipeline, fork": zarr_contender("torch fork", pipeline=PYTHON_PIPELINE),
        "safeloader": zarr_contender("safeloader"),
    }
    for fmt, label in (("h5", "HDF5"), ("npz", "npz")):
        table[f"{label} opened in __init__"] = {
            **{kind: file_contender(fmt, kind) for kind in ("torch fork", *SLOW_STARTS, "num_workers=0", *THREADS)},
            "open per item, fork": file_contender(fmt, "torch fork", OpenPerItem),
            "lazy per worker, fork": file_contender(fmt, "torch fork", LazyPerWorker),
            "safeloader": file_contender(fmt, "safeloader"),
        }
    table.update(scenarios_handles.table())
    table.update(scenarios_polars.table())
    table.update(scenarios_executors.table())
    table.update(scenarios_blosc2.table())
    table.update(scenarios_pyav.table())
    table.update(scenarios_steady.table())
    table["BLAS in __getitem__"] = {kind: blas_contender(kind) for kind in loader_kinds()}
    table["Python-heavy transform (holds the GIL)"] = {
        kind: text_contender(kind) for kind in ("torch fork", "num_workers=0", *THREADS, "safeloader")
    }
    table["worker memory, many objects, one gc.collect()"] = {
        "torch fork": memory_contender("torch fork"),
        "spawn": memory_contender("spawn"),
        "safeloader, freeze_gc=False": memory_contender("safeloader", freeze_gc=False),
        "safeloader": memory_contender("safeloader"),
    }
    return table
