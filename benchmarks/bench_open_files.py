"""An epoch with many read-only files open in the parent: safeloader vs torch's fork loader.

    python -m benchmarks.bench_open_files [--pairs 12] [--files 4000] [--workers 2] [--items 8]

Each sample is a fresh interpreter that opens ``--files`` small read-only files, then times one
epoch (start to last batch) of ``--workers`` workers over ``--items`` items, reading each item
from one file the Dataset holds. Where the files are held: ``elsewhere`` (a shard cache of the
training script's, which the Dataset does not reach), ``dataset`` (the Dataset holds them all),
or ``none`` (no file but the Dataset's one: the start time with no files open). torch's loader and
safeloader alternate, one process each per pair; the ratio is the median over pairs of
safeloader's time divided by torch's in the same pair. Issue 42, item 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PLACES = ("none", "elsewhere", "dataset")


def child(loader_name: str, directory: str, files: int, place: str, workers: int, items: int) -> None:
    """One sample, in a fresh interpreter: prints the epoch's milliseconds."""
    import torch.utils.data

    if loader_name == "torch":
        loader_class = torch.utils.data.DataLoader
    else:
        from safeloader import DataLoader as loader_class

    shards = [open(os.path.join(directory, f"{i}.bin"), "rb") for i in range(files if place != "none" else 0)]

    class Items(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.file = open(os.path.join(directory, "items.bin"), "rb")
            self.shards = shards if place == "dataset" else []

        def __len__(self) -> int:
            return items

        def __getitem__(self, index: int) -> bytes:
            self.file.seek(index)
            return self.file.read(1)

    dataset = Items()
    start = time.perf_counter()
    assert len(list(loader_class(dataset, batch_size=None, num_workers=workers))) == items
    print(json.dumps((time.perf_counter() - start) * 1e3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--places", default=",".join(PLACES))
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        loader_name, directory, files, place, workers, items = args.child
        child(loader_name, directory, int(files), place, int(workers), int(items))
        return
    with tempfile.TemporaryDirectory() as directory:
        for i in range(args.files):
            with open(os.path.join(directory, f"{i}.bin"), "wb") as f:
                f.write(b"x" * 64)
        with open(os.path.join(directory, "items.bin"), "wb") as f:
            f.write(bytes(range(256)))
        for place in args.places.split(","):
            times: dict[str, list[float]] = {"torch": [], "safeloader": []}
            for _ in range(args.pairs):
                for name in times:
                    command = [sys.executable, "-m", "benchmarks.bench_open_files", "--child", name, directory,
                               str(args.files), place, str(args.workers), str(args.items)]
                    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120).stdout
                    times[name].append(float(out.splitlines()[-1]))
            ratios = [s / t for s, t in zip(times["safeloader"], times["torch"])]
            print(f"files held {place:9} ({args.files if place != 'none' else 0} files): "
                  f"torch {statistics.median(times['torch']):6.1f} ms, "
                  f"safeloader {statistics.median(times['safeloader']):6.1f} ms, "
                  f"ratio {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}, "
                  f"{args.pairs} pairs)")


if __name__ == "__main__":
    main()
