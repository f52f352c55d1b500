"""Loader starts while other Python threads of the parent are busy: safeloader vs torch's fork loader.

    python -m benchmarks.bench_busy_threads [--threads 3] [--repeats 21] [--workers 4]

The parent runs ``--threads`` threads of pure-Python work (they hold the GIL in turn, as a
data-preparation or logging thread does) while the main thread starts loaders over a trivial
Dataset, torch's and safeloader's alternating. Each start is timed to its first batch and to
the end of its epoch; each ratio is the median over pairs of safeloader's time over torch's.
Every pause that lets go of the GIL on the start path can cost a switch interval (5 ms) here.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from .common import print_table, write_json


def _spin(stop: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        for i in range(1000):
            total += i


def run(threads: int, repeats: int, workers: int) -> dict:
    import torch
    from torch.utils.data import DataLoader as TorchLoader

    from safeloader import DataLoader as SafeLoader

    class Trivial(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int) -> int:
            return index

    loaders = {"torch fork": TorchLoader, "safeloader": SafeLoader}
    times: dict[str, dict[str, list[float]]] = {name: {"first batch": [], "epoch": []} for name in loaders}
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,), daemon=True) for _ in range(threads)]
    for spinner in spinners:
        spinner.start()
    try:
        for pair in range(repeats):
            for name in list(loaders) if pair % 2 == 0 else list(reversed(loaders)):
                start = time.perf_counter()
                iterator = iter(loaders[name](Trivial(), batch_size=8, num_workers=workers))
                next(iterator)
                times[name]["first batch"].append(time.perf_counter() - start)
                for _ in iterator:
                    pass
                times[name]["epoch"].append(time.perf_counter() - start)
                del iterator
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    result = {}
    for measure in ("first batch", "epoch"):
        safe, torch_ = times["safeloader"][measure], times["torch fork"][measure]
        result[measure] = {
            "torch ms": statistics.median(torch_) * 1e3,
            "safeloader ms": statistics.median(safe) * 1e3,
            "ratio": statistics.median(s / t for s, t in zip(safe, torch_)),
        }
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=3, help="busy Python threads in the parent")
    parser.add_argument("--repeats", type=int, default=21, help="alternating pairs")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    result = run(args.threads, args.repeats, args.workers)
    print(f"\n{args.threads} busy Python threads, {args.workers} workers, median of {args.repeats} alternating pairs:")
    print_table(
        [[m, f"{r['torch ms']:.0f}", f"{r['safeloader ms']:.0f}", f"{r['ratio']:.2f}x"] for m, r in result.items()],
        ["to", "torch fork ms", "safeloader ms", "safeloader / torch"],
    )
    path = write_json("busy_threads", {"benchmark": "busy_threads", "threads": args.threads, "workers": args.workers,
                                       "repeats": args.repeats, "results": result})
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
