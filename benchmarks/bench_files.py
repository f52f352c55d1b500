"""Items/s reading files in workers: handles opened once in __init__ (safeloader) vs
opening the file in every __getitem__ vs lazy per-worker opening.

    python -m benchmarks.bench_files [--items 1500] [--rounds 7] [--workers 2]

For each format (HDF5 on the default and stdio drivers, npz, plain binary
file), each contender reads ``--items`` random records (one epoch, worker
start included) with the same safeloader DataLoader; only the way the
Dataset gets its handle differs. "lazy, torch" is the usual workaround under
torch's own DataLoader, and "file hooks only" is safeloader with its other
backends' hooks disabled, for reference. Contenders alternate round by round.
Also measures the "files" hook itself in a forked child with 8 and 256
inherited open files.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset, RandomSampler

import safeloader
from safeloader.backends import files as files_backend

from .common import alternate, print_table, summarize, write_json

RECORD = 256
COUNT = 4096
NPZ_MEMBERS = 512


def make_files(directory: Path) -> dict[str, Path]:
    data = np.random.default_rng(0).integers(0, 256, (COUNT, RECORD), dtype=np.uint8)
    paths = {"h5": directory / "data.h5", "npz": directory / "data.npz", "bin": directory / "data.bin"}
    with h5py.File(paths["h5"], "w") as f:
        f.create_dataset("x", data=data, chunks=(16, RECORD), compression="gzip")
    np.savez(paths["npz"], **{f"m{i}": data[i] for i in range(NPZ_MEMBERS)})
    data.tofile(paths["bin"])
    return paths


def opener(kind: str, path: str):
    """Returns (open() -> handle, read(handle, i) -> array)."""
    if kind in ("h5py", "h5py-stdio"):
        driver = "stdio" if kind == "h5py-stdio" else None
        return (lambda: h5py.File(path, "r", driver=driver)), (lambda h, i: h["x"][i])
    if kind == "npz":
        return (lambda: np.load(path)), (lambda h, i: h[f"m{i % NPZ_MEMBERS}"])

    def read_record(h, i):
        h.seek(i * RECORD)
        return np.frombuffer(h.read(RECORD), np.uint8)

    return (lambda: open(path, "rb")), read_record


class Reader(Dataset):
    """One Dataset, three ways to get the handle: "init", "per-item" or "lazy"."""

    def __init__(self, kind: str, path: str, strategy: str) -> None:
        self.kind, self.path, self.strategy = kind, path, strategy
        self.open, self.read = opener(kind, path)
        self.handle = self.open() if strategy == "init" else None

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, i: int):
        if self.strategy == "per-item":
            handle = self.open()
            try:
                return self.read(handle, i)
            finally:
                handle.close()
        if self.handle is None:  # lazy: first use in this worker
            self.handle = self.open()
        return self.read(self.handle, i)


def only_file_hooks(*args, **kwargs):
    """safeloader's loader with every hook but the file-handle ones disabled: their cost alone."""
    others = tuple(h.name for h in safeloader.hooks() if h.name not in ("files", "h5py"))
    return safeloader.DataLoader(*args, disable_hooks=others, **kwargs)


def epoch_seconds(loader_class, dataset: Reader, items: int, workers: int) -> float:
    sampler = RandomSampler(dataset, replacement=True, num_samples=items, generator=torch.Generator().manual_seed(0))
    loader = loader_class(dataset, batch_size=32, sampler=sampler, num_workers=workers)
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def hook_cost(open_files: int, path: Path, repeats: int = 20) -> float:
    """Seconds the "files" hook takes in a forked child holding ``open_files`` read-only files."""
    handles = [open(path, "rb") for _ in range(open_files)]
    samples = []
    try:
        for _ in range(repeats):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: privatize its inherited descriptors, report the time
                start = time.perf_counter()
                files_backend.privatize_inherited_files()
                os.write(write, repr(time.perf_counter() - start).encode())
                os._exit(0)
            os.close(write)
            samples.append(float(os.read(read, 64)))
            os.close(read)
            os.waitpid(pid, 0)
    finally:
        for h in handles:
            h.close()
    return sorted(samples)[len(samples) // 2]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    results: dict = {"items": args.items, "workers": args.workers, "rounds": args.rounds, "formats": {}}
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_files(Path(tmp))
        formats = {"h5py": paths["h5"], "h5py-stdio": paths["h5"], "npz": paths["npz"], "plain file": paths["bin"]}
        rows = []
        for kind, path in formats.items():
            def contender(loader_class, strategy, kind=kind, path=path):
                return lambda: args.items / epoch_seconds(
                    loader_class, Reader(kind, str(path), strategy), args.items, args.workers
                )

            contenders = {
                "init, safeloader": contender(safeloader.DataLoader, "init"),
                "init, safeloader, file hooks only": contender(only_file_hooks, "init"),
                "lazy, safeloader": contender(safeloader.DataLoader, "lazy"),
                "per-item, safeloader": contender(safeloader.DataLoader, "per-item"),
                "lazy, torch": contender(torch.utils.data.DataLoader, "lazy"),
            }
            samples = alternate(contenders, args.rounds, progress=kind)
            summary = {name: summarize(values) for name, values in samples.items()}
            # Ratios round by round (contenders of a round ran back to back), then the
            # median: load from other processes moves whole rounds more than contenders.
            init = samples["init, safeloader"]
            ratios = {name: statistics.median(a / b for a, b in zip(init, values)) for name, values in samples.items()}
            results["formats"][kind] = {"items_per_s": summary, "init_over": ratios, "samples": samples}
            for name, s in summary.items():
                rows.append([kind, name, f"{s['median']:.0f}", f"{s['min']:.0f}-{s['max']:.0f}", f"{ratios[name]:.3f}"])
        print_table(rows, ["format", "contender", "items/s (median)", "range", "init / this (median of rounds)"])

        costs = {n: hook_cost(n, paths["bin"]) for n in (8, 256)}
        results["files_hook_seconds_per_worker"] = costs
        print()
        print_table([[str(n), f"{c * 1e6:.0f} µs"] for n, c in costs.items()],
                    ["open read-only files", '"files" hook per worker (median)'])
    path = write_json("files", results)
    print(f"\nwrote {path}")
    return results


if __name__ == "__main__":
    main()
