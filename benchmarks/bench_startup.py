"""Time to first batch and per-fork hook overhead: safeloader vs torch's fork loader vs spawn.

    python -m benchmarks.bench_startup [--workers 4] [--repeats 20] [--spawn-repeats 3]

Each contender builds a fresh loader over a trivial Dataset and takes one
batch, worker start included; contenders alternate. safeloader runs with
every built-in backend registered (none of their libraries imported, as in a
plain program) plus four user hooks, so the figure includes the dispatch cost.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader as TorchDataLoader

import safeloader

from .common import alternate, print_table, summarize, timed, write_json


class Trivial(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        return index


def first_batch(make_loader) -> float:
    def run() -> None:
        loader = make_loader()
        iterator = iter(loader)
        next(iterator)
        del iterator

    return timed(run)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--spawn-repeats", type=int, default=3)
    args = parser.parse_args(argv)

    counter = [0]

    def user_hook() -> None:
        counter[0] += 1

    for i in range(4):
        safeloader.register_at_fork(before=user_hook, after_in_parent=user_hook, after_in_child=user_hook,
                                    name=f"bench.user{i}", replace=True)
    n = args.workers
    fork = {
        "torch fork": lambda: first_batch(lambda: TorchDataLoader(Trivial(), batch_size=8, num_workers=n)),
        "safeloader": lambda: first_batch(lambda: safeloader.DataLoader(Trivial(), batch_size=8, num_workers=n)),
    }
    fork_samples = alternate(fork, args.repeats, progress="fork start-up")
    spawn_samples = alternate(
        {"torch spawn": lambda: first_batch(lambda: TorchDataLoader(Trivial(), batch_size=8, num_workers=n,
                                                                   multiprocessing_context="spawn"))},
        args.spawn_repeats,
        progress="spawn start-up",
    )
    results = {name: summarize(v) for name, v in {**fork_samples, **spawn_samples}.items()}
    safe = results["safeloader"]["median"]
    torch_fork = results["torch fork"]["median"]
    overhead_per_fork = (safe - torch_fork) / n
    rows = [[name, f"{r['median'] * 1000:.1f}", f"{r['min'] * 1000:.1f}", f"{r['max'] * 1000:.1f}",
             f"{r['median'] / safe:.2f}x"] for name, r in results.items()]
    print(f"\nTime to first batch, {n} workers, median of {args.repeats} (spawn: {args.spawn_repeats}):")
    print_table(rows, ["loader", "median ms", "min ms", "max ms", "vs safeloader"])
    print(f"\nsafeloader / torch fork: {safe / torch_fork:.3f}  (target <= 1.10)")
    print(f"spawn / safeloader:      {results['torch spawn']['median'] / safe:.1f}x  (target >= 20x)")
    print(f"hook overhead per fork:  {overhead_per_fork * 1e6:.0f} us (difference of medians / workers)")
    payload = {
        "benchmark": "startup",
        "workers": n,
        "results": results,
        "ratios": {
            "safeloader_vs_torch_fork": safe / torch_fork,
            "spawn_vs_safeloader": results["torch spawn"]["median"] / safe,
        },
        "overhead_per_fork_s": overhead_per_fork,
    }
    path = write_json("startup", payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
