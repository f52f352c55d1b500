"""Time to first batch and per-fork hook overhead: safeloader vs torch's fork loader vs spawn.

    python -m benchmarks.bench_startup [--workers 4] [--repeats 20] [--spawn-repeats 3]

Each contender builds a fresh loader over a trivial Dataset and takes one
batch, worker start included; contenders alternate. safeloader runs with
every built-in backend registered plus four user hooks, so the figure includes
the dispatch cost: first with none of the backends' libraries imported (a plain
program), then with every one imported and a Dataset holding an LMDB
environment, an HTTP session and an fsspec filesystem, so that every backend
has work to do at each fork (``bench_hook_cost`` splits that cost per hook).

These are warm starts, in a process that started loaders before. The first
starts of fresh processes, with three import sets, follow
(``bench_first_start``; ``--fresh-pairs 0`` leaves them out).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time

import torch
from torch.utils.data import DataLoader as TorchDataLoader

import safeloader

from .bench_hook_cost import Handles, import_backend_libraries
from .common import alternate, print_table, summarize, write_json


class Trivial(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        return index


class TrivialWithHandles(Handles, Trivial):
    """The trivial Dataset, holding the handles every backend acts on at a fork."""


def _usage() -> tuple[float, int]:
    """(CPU seconds, minor page faults) of this process (all threads) and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime,
            own.ru_minflt + children.ru_minflt)


def first_batch(make_loader, usage: list[tuple[float, int]] | None = None,
                shutdowns: list[float] | None = None) -> float:
    """Seconds from building the loader to its first batch (the workers' start).

    The workers are then shut down and reaped outside the timing; ``shutdowns``
    gets how long that took. ``usage`` gets the CPU seconds and the page faults of
    the whole start and shutdown, the workers' included (counted once they are
    reaped). On a busy machine CPU time moves less than wall time, and the number
    of faults (mostly copy-on-write copies of pages shared with the parent)
    hardly at all."""
    before = _usage()
    start = time.perf_counter()
    iterator = iter(make_loader())
    next(iterator)
    seconds = time.perf_counter() - start
    del iterator  # shuts the workers down and reaps them
    if shutdowns is not None:
        shutdowns.append(time.perf_counter() - start - seconds)
    if usage is not None:
        after = _usage()
        usage.append((after[0] - before[0], after[1] - before[1]))
    return seconds


def paired_difference(first: list[float | None], second: list[float | None]) -> float:
    """Median of ``first[i] - second[i]``: the two ran back to back in round i, so
    the machine's noise of that moment mostly cancels out (steadier than a
    difference of medians)."""
    return statistics.median(a - b for a, b in zip(first, second) if a is not None and b is not None)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--spawn-repeats", type=int, default=3)
    parser.add_argument("--fresh-pairs", type=int, default=11,
                        help="fresh-process pairs per import set for the first starts (0: skip)")
    args = parser.parse_args(argv)

    counter = [0]

    def user_hook() -> None:
        counter[0] += 1

    for i in range(4):
        safeloader.register_at_fork(before=user_hook, after_in_parent=user_hook, after_in_child=user_hook,
                                    name=f"bench.user{i}", replace=True)
    n = args.workers
    names = ("torch fork", "safeloader", "torch fork, libraries", "safeloader, libraries")
    cpu: dict[str, list[tuple[float, int]]] = {name: [] for name in names}
    shutdown: dict[str, list[float]] = {name: [] for name in names}
    fork = {
        "torch fork": lambda: first_batch(lambda: TorchDataLoader(Trivial(), batch_size=8, num_workers=n),
                                          cpu["torch fork"], shutdown["torch fork"]),
        "safeloader": lambda: first_batch(lambda: safeloader.DataLoader(Trivial(), batch_size=8, num_workers=n),
                                          cpu["safeloader"], shutdown["safeloader"]),
    }
    fork_samples = alternate(fork, args.repeats, progress="fork start-up")
    spawn_samples = alternate(
        {"torch spawn": lambda: first_batch(lambda: TorchDataLoader(Trivial(), batch_size=8, num_workers=n,
                                                                   multiprocessing_context="spawn"))},
        args.spawn_repeats,
        progress="spawn start-up",
    )
    # Last: importing the libraries cannot be undone in this process.
    imported = import_backend_libraries()
    with tempfile.TemporaryDirectory() as directory:
        dataset = TrivialWithHandles(directory)
        loaded = {
            "torch fork, libraries": lambda: first_batch(
                lambda: TorchDataLoader(dataset, batch_size=8, num_workers=n),
                cpu["torch fork, libraries"], shutdown["torch fork, libraries"]),
            "safeloader, libraries": lambda: first_batch(
                lambda: safeloader.DataLoader(dataset, batch_size=8, num_workers=n),
                cpu["safeloader, libraries"], shutdown["safeloader, libraries"]),
        }
        loaded_samples = alternate(loaded, args.repeats, progress="fork start-up, libraries imported")
    results = {name: summarize(v) for name, v in {**fork_samples, **spawn_samples, **loaded_samples}.items()}
    safe = results["safeloader"]["median"]
    torch_fork = results["torch fork"]["median"]
    # Per worker fork: the median of the paired differences (each round ran torch
    # and safeloader back to back), divided by the workers.
    overhead_per_fork = paired_difference(fork_samples["safeloader"], fork_samples["torch fork"]) / n
    loaded_overhead_per_fork = paired_difference(
        loaded_samples["safeloader, libraries"], loaded_samples["torch fork, libraries"]) / n
    shutdown_median = {name: statistics.median(values) for name, values in shutdown.items()}
    cpu_median = {name: statistics.median(c for c, _ in values) for name, values in cpu.items()}
    faults_median = {name: statistics.median(f for _, f in values) for name, values in cpu.items()}
    cpu_per_fork = (cpu_median["safeloader"] - cpu_median["torch fork"]) / n
    loaded_cpu_per_fork = (cpu_median["safeloader, libraries"] - cpu_median["torch fork, libraries"]) / n
    faults_per_fork = (faults_median["safeloader"] - faults_median["torch fork"]) / n
    loaded_faults_per_fork = (faults_median["safeloader, libraries"] - faults_median["torch fork, libraries"]) / n
    rows = [[name, f"{r['median'] * 1000:.1f}", f"{r['min'] * 1000:.1f}", f"{r['max'] * 1000:.1f}",
             f"{r['median'] / safe:.2f}x"] for name, r in results.items()]
    print(f"\nTime to first batch, {n} workers, median of {args.repeats} (spawn: {args.spawn_repeats}):")
    print_table(rows, ["loader", "median ms", "min ms", "max ms", "vs safeloader"])
    print(f"\nsafeloader / torch fork: {safe / torch_fork:.3f}  (target <= 1.10)")
    print(f"spawn / safeloader:      {results['torch spawn']['median'] / safe:.1f}x  (target >= 20x)")
    print(f"hook overhead per fork:  {overhead_per_fork * 1e6:.0f} us wall (median paired difference / workers), "
          f"{cpu_per_fork * 1e6:.0f} us CPU (parent and workers), {faults_per_fork:.0f} page faults")
    print(f"with every backend library imported ({', '.join(imported)}) and handles held:")
    print(f"  safeloader / torch fork: "
          f"{results['safeloader, libraries']['median'] / results['torch fork, libraries']['median']:.3f}")
    print(f"  hook overhead per fork:  {loaded_overhead_per_fork * 1e6:.0f} us wall, "
          f"{loaded_cpu_per_fork * 1e6:.0f} us CPU, {loaded_faults_per_fork:.0f} page faults (target <= 2000 us)")
    print("shutdown after the first batch (not in the times above), median ms: "
          + ", ".join(f"{name} {seconds * 1e3:.1f}" for name, seconds in shutdown_median.items()))
    payload = {
        "benchmark": "startup",
        "workers": n,
        "results": results,
        "ratios": {
            "safeloader_vs_torch_fork": safe / torch_fork,
            "spawn_vs_safeloader": results["torch spawn"]["median"] / safe,
        },
        "overhead_per_fork_s": overhead_per_fork,
        "libraries_imported": imported,
        "libraries_overhead_per_fork_s": loaded_overhead_per_fork,
        "shutdown_median_s": shutdown_median,
        "cpu_median_s": cpu_median,
        "page_faults_median": faults_median,
        "page_faults_per_fork": faults_per_fork,
        "libraries_page_faults_per_fork": loaded_faults_per_fork,
        "cpu_overhead_per_fork_s": cpu_per_fork,
        "libraries_cpu_overhead_per_fork_s": loaded_cpu_per_fork,
    }
    if args.fresh_pairs:
        from . import bench_first_start

        fresh = bench_first_start.run(args.fresh_pairs, n)
        bench_first_start.print_results(fresh, args.fresh_pairs, n)
        payload["fresh_process_first_starts"] = fresh
    path = write_json("startup", payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
