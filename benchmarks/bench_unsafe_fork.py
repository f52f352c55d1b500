"""Cost of the ways out of an inherited polars pool: first batch of a fresh loader, three loaders per process.

    python -m benchmarks.bench_unsafe_fork [--workers 2] [--repeats 3]

The parent runs a group_by (polars' pool is live), then builds three loaders
one after the other over a Dataset that reads a small parquet file per item,
and times each loader's first batch (worker start included). Each process
starts fresh, so "loader 1" includes every once-per-process cost (safeloader:
the copy of polars' 170 MB runtime; forkserver: starting the server and
importing torch, polars and the Dataset's module in it).

Contenders: safeloader's polars backend (fork, a private polars runtime per
worker); safeloader with the backend off and ``on_unsafe_fork="forkserver"``
(the opt-in safe path for libraries without a backend); torch with spawn.
torch's fork loader hangs here and is not timed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

from .child import serve
from .common import print_table, summarize, write_json
from .suite import start_child

LOADERS = 3
DEADLINE = 300.0  # seconds for the set-up, then for the loaders: past it, a hang
CONTENDERS = ("safeloader polars backend (fork)", "safeloader on_unsafe_fork='forkserver'", "torch spawn")


class ParquetFiles(torch.utils.data.Dataset):
    def __init__(self, folder: str, count: int) -> None:
        self.folder, self.count = folder, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        import polars as pl

        return int(pl.read_parquet(os.path.join(self.folder, f"{index % 8}.parquet"))["v"].sum())


def _child(contender: str, folder: str, workers: int):
    """Set up the parent (polars' pool live); return a function timing the first batch of LOADERS loaders."""
    import numpy as np
    import polars as pl

    import safeloader

    rows = 2_000_000
    frame = pl.DataFrame({"k": np.arange(rows) % 1000, "v": np.arange(rows)})
    frame.group_by("k").agg(pl.col("v").sum())  # polars' pool is live in the parent
    dataset = ParquetFiles(folder, 4 * workers)

    def first_batches() -> dict:
        times = []
        for _ in range(LOADERS):
            if contender == CONTENDERS[0]:
                loader = safeloader.DataLoader(dataset, batch_size=2, num_workers=workers)
            elif contender == CONTENDERS[1]:
                loader = safeloader.DataLoader(
                    dataset, batch_size=2, num_workers=workers, disable_hooks=("polars",), on_unsafe_fork="forkserver"
                )
            else:
                loader = torch.utils.data.DataLoader(
                    dataset, batch_size=2, num_workers=workers, multiprocessing_context="spawn"
                )
            start = time.perf_counter()
            iterator = iter(loader)
            next(iterator)
            times.append(time.perf_counter() - start)
            del iterator
        return {"first_batch_s": times}

    return first_batches


def one_process(name: str, folder: str, workers: int) -> list[float] | None:
    """The first-batch times of ``name``'s loaders in a fresh process (None if it failed or hung)."""
    child = start_child(name, "benchmarks.bench_unsafe_fork", "--child", name, "--folder", folder,
                        "--workers", str(workers))
    try:
        result = child.measure(DEADLINE) if child.ready(time.monotonic() + DEADLINE) else None
    finally:
        child.close()
    if child.status != "ok":
        print(f"{name}: failed: {child.status}", file=sys.stderr)
    return None if result is None else result.get("first_batch_s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        serve(lambda: _child(args.child, args.folder, args.workers))
        return
    import polars as pl

    results: dict[str, list[list[float] | None]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory() as folder:
        for i in range(8):
            part = pl.DataFrame({"k": range(1000), "v": range(i, i + 1000)})
            part.write_parquet(os.path.join(folder, f"{i}.parquet"))
        for round_ in range(args.repeats):
            for name in CONTENDERS:  # alternating, so that machine noise hits all alike
                results[name].append(one_process(name, folder, args.workers))
                print(f"round {round_ + 1}/{args.repeats} {name}: {results[name][-1]}", file=sys.stderr)
    rows, payload = [], {}
    for name, runs in results.items():
        per_loader = [summarize([run[i] if run else None for run in runs]) for i in range(LOADERS)]
        payload[name] = per_loader
        cells = [
            f"{s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f})" if s["median"] else "failed" for s in per_loader
        ]
        rows.append([name, *cells])
    print_table(rows, ["contender"] + [f"loader {i + 1}, first batch" for i in range(LOADERS)])
    write_json("unsafe_fork", {"workers": args.workers, "repeats": args.repeats, "results": payload})


if __name__ == "__main__":
    main()
