"""What safeloader's at-fork callbacks cost, counted, in a fresh process: parent and workers.

    python scripts/fork_hook_counts.py {safeloader,torch} [--imports training|torch] [--starts 4]

Imports a training script's libraries (``--imports training``, as ``bench_first_start``) or
torch alone, then starts a loader over a trivial Dataset ``--starts`` times (4 workers, first
batch). Two sets of at-fork callbacks, one registered before safeloader is imported and one
after, bracket its callbacks: in the parent, ``before`` and ``after_in_parent`` run between them
(their wall time and the minor page faults of the forking thread); in each worker, its
``after_in_child`` hooks (CPU time and page faults, summed over the 4 workers). With torch's
loader the same brackets hold nothing: its figures are what the brackets themselves cost.
Prints the first start and the mean of the later ones. Counts hold still where times move:
the 2-core machines here move a start's time by 10-20% from run to run.
"""

from __future__ import annotations

import argparse
import importlib
import mmap
import os
import resource
import struct
import time

TRAINING = ("numpy", "pandas", "pyarrow.parquet", "polars", "zarr", "zarrs", "h5py", "lightning", "accelerate")
WORKERS = 4


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loader", choices=("safeloader", "torch"))
    parser.add_argument("--imports", choices=("training", "torch"), default="training")
    parser.add_argument("--starts", type=int, default=4)
    args = parser.parse_args()
    for name in TRAINING if args.imports == "training" else ():
        importlib.import_module(name)
    import torch

    shared = mmap.mmap(-1, 16 * 1024)  # per worker fork: its hooks' CPU seconds and page faults
    mark: dict[str, float] = {"fork": 0}
    totals = {"before ms": 0.0, "after ms": 0.0, "before faults": 0.0, "after faults": 0.0}

    # Registered first: its `before` runs last (innermost), its `after_*` first.
    def inner_before() -> None:
        mark["inner before"], mark["inner before faults"] = time.perf_counter(), _faults()

    def inner_after() -> None:
        mark["inner after"], mark["inner after faults"] = time.perf_counter(), _faults()

    def inner_child() -> None:
        mark["child cpu"] = time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)
        mark["child faults"] = _faults()

    os.register_at_fork(before=inner_before, after_in_parent=inner_after, after_in_child=inner_child)
    if args.loader == "safeloader":
        from safeloader import DataLoader
    else:
        from torch.utils.data import DataLoader

    def outer_before() -> None:
        mark["fork"] += 1
        mark["outer before"], mark["outer before faults"] = time.perf_counter(), _faults()

    def outer_after() -> None:
        totals["before ms"] += (mark["inner before"] - mark["outer before"]) * 1e3
        totals["before faults"] += mark["inner before faults"] - mark["outer before faults"]
        totals["after ms"] += (time.perf_counter() - mark["inner after"]) * 1e3
        totals["after faults"] += _faults() - mark["inner after faults"]

    def outer_child() -> None:
        cpu = time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID) - mark["child cpu"]
        struct.pack_into("dd", shared, 16 * int(mark["fork"]), cpu, _faults() - mark["child faults"])

    os.register_at_fork(before=outer_before, after_in_parent=outer_after, after_in_child=outer_child)

    class Trivial(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int) -> int:
            return index

    rows = []
    for _ in range(args.starts):
        for key in totals:
            totals[key] = 0.0
        first_fork = int(mark["fork"]) + 1
        before = resource.getrusage(resource.RUSAGE_SELF)
        iterator = iter(DataLoader(Trivial(), batch_size=8, num_workers=WORKERS))
        next(iterator)
        after = resource.getrusage(resource.RUSAGE_SELF)
        del iterator  # torch's shutdown joins the workers
        children = [struct.unpack_from("dd", shared, 16 * fork) for fork in range(first_fork, first_fork + WORKERS)]
        rows.append({
            **totals,
            "workers' hooks CPU ms": sum(cpu for cpu, _ in children) * 1e3,
            "workers' hooks faults": sum(faults for _, faults in children),
            "parent faults": after.ru_minflt - before.ru_minflt,
        })
    later = rows[1:] or rows
    for label, picked in (("first start", rows[:1]), ("later starts", later)):
        means = {key: sum(row[key] for row in picked) / len(picked) for key in rows[0]}
        print(f"{label:13s} " + "  ".join(f"{key} {value:.1f}" for key, value in means.items()))


if __name__ == "__main__":
    main()
