"""Loader starts from a parent whose descriptors end near a table size: safeloader vs torch's fork loader.

    python -m benchmarks.bench_fd_table [--ends 24 48 56 112] [--repeats 15] [--workers 4]

Linux grows a process's descriptor table (64 slots, then powers of two) when a new descriptor does
not fit, and in a process with several threads it waits for an RCU grace period first. A worker
inherits a table that just fits its parent's descriptors and opens its own (shared-memory tensors,
the sockets that pass them) with its feeder thread running; safeloader grows each worker's table
right after the fork instead (safeloader/_fd_table.py). For each ``--ends``, the parent holds
descriptors up to that number at least (a CUDA process holds 46 of 64), then starts loaders over a Dataset of
a tensor and two ints per item, torch's and safeloader's alternating; each start is timed to its
first batch and to the end of its epoch, each ratio the median over pairs of safeloader's time over
torch's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from .common import print_table, write_json


def run(ends: list[int], repeats: int, workers: int) -> dict:
    import torch
    from torch.utils.data import DataLoader as TorchLoader

    from safeloader import DataLoader as SafeLoader

    class ThreeTensors(torch.utils.data.Dataset):  # a tensor and two ints: three shared tensors a batch
        def __len__(self) -> int:
            return 96

        def __getitem__(self, index: int):
            return torch.ones(256), index, os.getppid()

    loaders = {"torch fork": TorchLoader, "safeloader": SafeLoader}
    result = {}
    for end in ends:
        held = []
        while not held or held[-1] < end:  # the parent's descriptors up to `end`
            held.append(os.open(os.devnull, os.O_RDONLY))
        times: dict[str, dict[str, list[float]]] = {name: {"first batch": [], "epoch": []} for name in loaders}
        for pair in range(repeats + 1):  # the first pair warms both loaders up and is not counted
            for name in list(loaders) if pair % 2 == 0 else list(reversed(loaders)):
                start = time.perf_counter()
                iterator = iter(loaders[name](ThreeTensors(), batch_size=8, num_workers=workers,
                                              multiprocessing_context="fork"))
                next(iterator)
                first = time.perf_counter() - start
                for _ in iterator:
                    pass
                if pair:
                    times[name]["first batch"].append(first)
                    times[name]["epoch"].append(time.perf_counter() - start)
                del iterator
        for measure in ("first batch", "epoch"):
            safe, torch_ = times["safeloader"][measure], times["torch fork"][measure]
            result[f"descriptors to {held[-1]}, {measure}"] = {
                "torch ms": statistics.median(torch_) * 1e3,
                "safeloader ms": statistics.median(safe) * 1e3,
                "ratio": statistics.median(s / t for s, t in zip(safe, torch_)),
            }
        for fd in held:
            os.close(fd)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ends", type=int, nargs="+", default=[24, 48, 56, 112],
                        help="the parent's highest descriptor in each run")
    parser.add_argument("--repeats", type=int, default=15, help="alternating pairs per run")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    result = run(args.ends, args.repeats, args.workers)
    print(f"\n{args.workers} workers, median of {args.repeats} alternating pairs:")
    print_table(
        [[m, f"{r['torch ms']:.0f}", f"{r['safeloader ms']:.0f}", f"{r['ratio']:.2f}x"] for m, r in result.items()],
        ["parent's descriptors, to", "torch fork ms", "safeloader ms", "safeloader / torch"],
    )
    path = write_json("fd_table", {"benchmark": "fd_table", "ends": args.ends, "workers": args.workers,
                                   "repeats": args.repeats, "results": result})
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
