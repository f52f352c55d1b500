"""Worker memory with and without ``freeze_gc``: a Dataset holding millions of Python objects.

Each forked worker shares the parent's pages until it writes them. Reading an
item writes its reference counts (copying the pages of the items it reads);
a full garbage collection writes the header of every container it examines
(copying every page that holds one). ``freeze_gc=True`` puts the parent's
objects out of the collector's reach in the workers.

Two workloads, each with 2 workers reading a random sample of the records:
- "reads only": the worker allocates little; on CPython 3.11-3.13 its
  collector rarely runs a full collection.
- "full collection": the worker also runs one ``gc.collect()``, as a long run
  eventually does, as libraries that call gc.collect() do, and as CPython
  3.14's incremental collector does bit by bit on every young collection.

Contenders alternate: torch's DataLoader, safeloader with freeze_gc False and True.
Run: python -m benchmarks.bench_memory (writes benchmarks/results/memory.json)
"""

from __future__ import annotations

import gc
import os
import platform
import random
import sys
import time

import psutil
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

import safeloader

from .common import write_json

RECORDS = 2_000_000
SAMPLE = 20_000
REPEATS = 2
MIB = 2**20


class Annotations(Dataset):
    """COCO-like metadata: one dict with a list per record, all GC-tracked containers."""

    def __init__(self, n: int, collect: bool) -> None:
        self.records = [{"id": i, "bbox": [i, i + 1, i + 2, i + 3], "label": i % 80} for i in range(n)]
        self.collect = collect
        self.collected = False

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.collect and not self.collected:
            self.collected = True
            gc.collect()
        record = self.records[index]
        return torch.tensor(record["bbox"] + [record["label"]])


def measure(make_loader, dataset: Annotations, sample: list[int]) -> dict[str, float]:
    loader = make_loader(dataset, sampler=sample, batch_size=64, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    start = time.perf_counter()
    checksum = sum(int(batch.sum()) for batch in iterator)
    elapsed = time.perf_counter() - start
    pids = [worker.pid for worker in iterator._workers]
    infos = [psutil.Process(pid).memory_full_info() for pid in pids]
    del iterator, loader
    gc.collect()
    return {
        "uss_mib": sum(i.uss for i in infos) / len(infos) / MIB,
        "pss_mib": sum(i.pss for i in infos) / len(infos) / MIB,
        "seconds": elapsed,
        "checksum": checksum,
    }


def main() -> None:
    contenders = {
        "torch DataLoader": lambda ds, **kw: TorchDataLoader(ds, **kw),
        "safeloader freeze_gc=False": lambda ds, **kw: safeloader.DataLoader(ds, freeze_gc=False, **kw),
        "safeloader freeze_gc=True": lambda ds, **kw: safeloader.DataLoader(ds, freeze_gc=True, **kw),
    }
    rng = random.Random(0)
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    parent_uss = {}
    for workload, collect in (("reads only", False), ("full collection", True)):
        dataset = Annotations(RECORDS, collect)
        parent_uss[workload] = psutil.Process().memory_full_info().uss / MIB
        results[workload] = {name: [] for name in contenders}
        for _ in range(REPEATS):
            for name, make in contenders.items():
                sample = rng.sample(range(RECORDS), SAMPLE)
                results[workload][name].append(measure(make, dataset, sample))
        del dataset
        gc.collect()

    # freeze/unfreeze cost, with the 2M-record heap gone: it is O(1) anyway.
    keep = [{"bbox": [i]} for i in range(RECORDS)]
    start = time.perf_counter()
    for _ in range(1000):
        gc.freeze()
        gc.unfreeze()
    freeze_us = (time.perf_counter() - start) / 1000 * 1e6
    del keep

    print(f"{RECORDS} records (2 GC-tracked containers each), {SAMPLE} read per epoch by 2 workers, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}")
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for workload, by_name in results.items():
        print(f"\n{workload}: parent USS {parent_uss[workload]:.0f} MiB")
        print(f"{'contender':30} {'worker USS MiB':>15} {'worker PSS MiB':>15} {'USS vs torch':>13}")
        base = min(r["uss_mib"] for r in by_name["torch DataLoader"])
        summary[workload] = {}
        for name, runs in by_name.items():
            uss = min(r["uss_mib"] for r in runs)
            pss = min(r["pss_mib"] for r in runs)
            summary[workload][name] = {"uss_mib": uss, "pss_mib": pss, "uss_ratio_vs_torch": uss / base}
            print(f"{name:30} {uss:15.1f} {pss:15.1f} {uss / base:13.2f}")
        checksums = {r["checksum"] for runs in by_name.values() for r in runs}
        assert len(checksums) > 0
    print(f"\ngc.freeze() + gc.unfreeze(): {freeze_us:.2f} us per fork")
    out = {
        "command": "python -m benchmarks.bench_memory",
        "records": RECORDS,
        "sample_per_epoch": SAMPLE,
        "parent_uss_mib": parent_uss,
        "summary_min_of_repeats": summary,
        "runs": results,
        "freeze_unfreeze_us": freeze_us,
    }
    print(f"wrote {write_json('memory', out)}")


if __name__ == "__main__":
    sys.exit(main())
