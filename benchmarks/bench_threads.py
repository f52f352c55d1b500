"""Throughput of a BLAS-heavy Dataset with 2 workers: safeloader's thread budget vs torch's default,
and the per-worker cost of the "threadpools" backend.

torch limits only its own threads in a worker, so numpy's OpenBLAS runs one
thread per core in each of N workers; safeloader gives each worker
cores // N threads. Contenders alternate run by run so machine noise hits
both alike. Run: python -m benchmarks.bench_threads (writes benchmarks/results/threads.json)
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

import numpy as np
import threadpoolctl
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

import safeloader
from safeloader._options import available_cores, default_thread_budget
from safeloader.backends import threadpools

from .common import write_json

ITEMS = 64
SIZE = 384
REPEATS = 4
WORKERS = 2


class MatmulDataset(Dataset):
    """Each item: a chain of float64 matrix products (numpy -> OpenBLAS)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.a = rng.standard_normal((SIZE, SIZE)) / SIZE**0.5

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> torch.Tensor:
        x = self.a
        for _ in range(6):
            x = x @ self.a
        return torch.tensor([float(x[0, 0]), float(index)])


def run(make_loader) -> float:
    loader = make_loader(MatmulDataset(), batch_size=4, num_workers=WORKERS)
    start = time.perf_counter()
    items = sum(len(batch) for batch in loader)
    elapsed = time.perf_counter() - start
    assert items == ITEMS
    return ITEMS / elapsed


def hook_costs(samples: int = 20) -> tuple[list[float], list[float]]:
    """Microseconds the backend spends in the parent per fork (fork-state record, plan), and in
    the forked child (applying the limits), measured on real forks."""
    from safeloader._context import ForkContext

    parent_us, child_us = [], []
    for _ in range(samples):
        ctx = ForkContext(0, WORKERS, safeloader.get_options())
        start = time.perf_counter()
        plan = threadpools.BACKEND.before(ctx)  # what the parent runs before each worker fork
        parent_us.append((time.perf_counter() - start) * 1e6)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            start = time.perf_counter()
            threadpools.BACKEND.after_in_child(ctx, plan)  # what each worker runs
            os.write(write, str((time.perf_counter() - start) * 1e6).encode())
            os._exit(0)
        os.close(write)
        child_us.append(float(os.read(read, 64)))
        os.close(read)
        os.waitpid(pid, 0)
    return parent_us, child_us


class Trivial(Dataset):
    """No work per item: the time to the first batch is worker start-up, hooks included."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


def first_batch_seconds(disable: frozenset[str]) -> float:
    loader = safeloader.DataLoader(Trivial(), batch_size=1, num_workers=WORKERS, disable_hooks=disable)
    start = time.perf_counter()
    next(iter(loader))
    return time.perf_counter() - start


def main() -> None:
    contenders = {
        "torch DataLoader (default)": lambda ds, **kw: TorchDataLoader(ds, **kw),
        "safeloader (thread budget)": lambda ds, **kw: safeloader.DataLoader(ds, **kw),
    }
    run(contenders["torch DataLoader (default)"])  # warm-up: page cache, OpenBLAS buffers
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(REPEATS):
        for name, make in contenders.items():
            rates[name].append(run(make))

    hook_costs(2)  # warm-up: the first call builds threadpoolctl's controller (cached while libraries stay the same)
    parent_us, child_us = hook_costs()
    with_hooks, without = [], []
    for _ in range(6):
        with_hooks.append(first_batch_seconds(frozenset()))
        without.append(first_batch_seconds(frozenset({"threadpools", "forkstate"})))

    cores = available_cores()
    blas = {i["internal_api"]: i["num_threads"] for i in threadpoolctl.threadpool_info()}
    print(f"{cores} cores available, {WORKERS} workers, parent pools {blas}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, numpy {np.__version__}")
    print(f"budget per worker: {default_thread_budget(WORKERS)} thread(s) "
          f"(torch default: {blas.get('openblas')} OpenBLAS threads per worker)")
    base = statistics.median(rates["torch DataLoader (default)"])
    print(f"\n{'contender':30} {'items/s (median)':>17} {'runs':>30} {'vs torch':>9}")
    summary = {}
    for name, values in rates.items():
        median = statistics.median(values)
        summary[name] = {"items_per_s_median": median, "ratio_vs_torch": median / base, "runs": values}
        runs = " ".join(f"{v:.1f}" for v in values)
        print(f"{name:30} {median:17.1f} {runs:>30} {median / base:9.2f}")
    cost = {
        "parent_per_fork_us_median": statistics.median(parent_us),
        "child_per_worker_us_median": statistics.median(child_us),
        "child_per_worker_us_max": max(child_us),
        "first_batch_s_with_hooks_median": statistics.median(with_hooks),
        "first_batch_s_without_median": statistics.median(without),
    }
    print("\nper-worker cost of the backend:")
    print(f"  parent, per fork (fork-state record + plan): {cost['parent_per_fork_us_median']:.0f} us median")
    print(f"  worker, once (apply limits): {cost['child_per_worker_us_median']:.0f} us median, "
          f"{cost['child_per_worker_us_max']:.0f} us max")
    print(f"  time to first batch, {WORKERS} workers: {cost['first_batch_s_with_hooks_median'] * 1000:.0f} ms with, "
          f"{cost['first_batch_s_without_median'] * 1000:.0f} ms without (median of 6, noisy)")
    out = {
        "command": "python -m benchmarks.bench_threads",
        "parent_pools": blas,
        "workload": {"items": ITEMS, "matrix": SIZE, "products_per_item": 6, "workers": WORKERS},
        "throughput": summary,
        "cost": cost,
    }
    print(f"wrote {write_json('threads', out)}")


if __name__ == "__main__":
    sys.exit(main())
