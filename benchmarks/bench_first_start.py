"""The first loader starts of a fresh process: safeloader vs torch's fork loader, as ratios.

    python -m benchmarks.bench_first_start [--pairs 15] [--workers 4]

Each sample is a fresh interpreter that imports a set of libraries (as a
training script does), then starts a loader over a trivial Dataset (64 items of
``torch.zeros(16)``, batch 4) three times, timing each start to its first batch;
torch's loader and safeloader alternate, one process each per pair, and each ratio
is the median over pairs of safeloader's time divided by torch's in the same pair,
with a 95% bootstrap confidence interval over the pairs: a ratio is "not
distinguishable from 1.0" only when its interval holds 1.0. The parent's CPU time
and page faults over torch's are reported too. The import sets: torch only (about
45 extension modules), a realistic training script's imports (about 250), the
same with the idle threads a trainer has (two Python threads waiting, OpenBLAS's
and torch's pools started), and that script plus more of the common native
packages (about 300 with scikit-learn and OpenCV, which ``make bench-imports``
installs beside the ``.venv``; without them the set reaches what is installed).
The number of extension modules loaded is reported beside each set.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .common import print_table, write_json

TRAINING_SCRIPT = ("numpy", "pandas", "pyarrow.parquet", "polars", "zarr", "zarrs", "h5py", "pytorch_lightning",
                   "accelerate")
IMPORT_SETS: dict[str, tuple[str, ...]] = {
    "torch only": (),
    "training script": TRAINING_SCRIPT,
    "training script + threads": TRAINING_SCRIPT,
    "more native packages": (*TRAINING_SCRIPT, "scipy.signal", "scipy.sparse.linalg", "sklearn.ensemble", "cv2",
                             "PIL.Image", "lmdb", "requests"),
}
WITH_THREADS = {"training script + threads"}
LARGEST = "more native packages"
STARTS = 3
# `make bench-imports` installs scipy, scikit-learn and OpenCV here, not in the .venv the tests use.
BENCH_IMPORTS = Path(__file__).resolve().parent.parent / "build" / "bench-imports"


def _child(loader: str, import_set: str, workers: int) -> None:
    if import_set == LARGEST and BENCH_IMPORTS.is_dir():
        # Last: numpy and the rest stay the .venv's. Only here: pandas and lightning import scipy when found.
        sys.path.append(str(BENCH_IMPORTS))
    imported = []
    for name in IMPORT_SETS[import_set]:
        try:
            importlib.import_module(name)
            imported.append(name)
        except ImportError:
            pass
    import os

    import torch

    if import_set in WITH_THREADS:
        _start_idle_threads()

    # os.fork() itself, timed innermost (registered before safeloader's callbacks: its `before` runs
    # before this one's, its `after_in_parent` after): the kernel's copy of the parent's page tables,
    # and the C at-fork handlers of the libraries (OpenBLAS stops its pool) and Python's own,
    # registered before this; the largest and most variable part of a start in a large process
    # (6-10 ms a fork with 300 extension modules on 2 cores). Both loaders' pairs report it.
    assert "safeloader" not in sys.modules, "imported before the fork timer: its callbacks would be inside it"
    forking: list[float] = [0.0, 0.0]  # [when the current fork began, seconds in forks this start]

    def fork_began() -> None:
        forking[0] = time.perf_counter()

    def fork_ended() -> None:
        forking[1] += time.perf_counter() - forking[0]

    os.register_at_fork(before=fork_began, after_in_parent=fork_ended)
    if loader == "safeloader":
        from safeloader import DataLoader
    else:
        from torch.utils.data import DataLoader

    class Trivial(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.zeros(16)

    times, faults, cpu, forks, workers_cpu = [], [], [], [], []
    for _ in range(STARTS):
        forking[1] = 0.0
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        iterator = iter(DataLoader(Trivial(), batch_size=4, num_workers=workers))
        next(iterator)
        times.append(time.perf_counter() - start)
        forks.append(forking[1])
        after = resource.getrusage(resource.RUSAGE_SELF)
        faults.append(after.ru_minflt - before.ru_minflt)  # pages the parent wrote after a fork, mostly
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        del iterator  # torch's shutdown joins the workers: their CPU, whole lives, is counted below
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        workers_cpu.append(children.ru_utime + children.ru_stime - children_before.ru_utime - children_before.ru_stime)
    extensions = sum(1 for m in list(sys.modules.values()) if str(getattr(m, "__file__", "")).endswith(".so"))
    print(json.dumps({"times": times, "forks": forks, "faults": faults, "cpu": cpu, "workers_cpu": workers_cpu,
                      "extensions": extensions,
                      "imported": imported}))


def _start_idle_threads() -> None:
    """What a trainer has running when its loader starts: Python threads waiting for work (a metrics
    flusher, a checkpoint uploader) and the native pools its first tensor and array operations
    started (OpenBLAS's, torch's intra-op pool), idle."""
    import threading

    import numpy
    import torch

    stop = threading.Event()
    for name in ("metrics-flusher", "checkpoint-uploader"):
        threading.Thread(target=stop.wait, name=name, daemon=True).start()
    numpy.ones((256, 256)) @ numpy.ones((256, 256))
    torch.ones(256, 256) @ torch.ones(256, 256)


def bootstrap_interval(ratios: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``ratios`` (one per pair): pairs resampled
    with replacement, the median of each resample, its 2.5th and 97.5th percentiles."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def verdict(low: float, high: float, goal: float) -> str:
    """What the interval allows us to say against 1.0 and against the goal."""
    if low <= 1.0 <= high:
        return "not distinguishable from 1.0"
    if high <= goal:
        return f"within {goal:.2f}x"
    if low > goal:
        return f"above {goal:.2f}x"
    return f"may exceed {goal:.2f}x"


def _compile_safeloader() -> None:
    """Write safeloader's bytecode as an install does: torch's comes compiled from its wheel, and a
    tree run under PYTHONDONTWRITEBYTECODE would otherwise compile each module it imports, every time."""
    import compileall
    import os

    import safeloader

    compileall.compile_dir(os.path.dirname(safeloader.__file__), quiet=1)


def _sample(loader: str, import_set: str, workers: int) -> dict:
    command = [sys.executable, "-W", "ignore", "-m", "benchmarks.bench_first_start", "--child", loader, import_set,
               "--workers", str(workers)]
    output = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def run(pairs: int, workers: int, import_sets: list[str] | None = None) -> dict:
    """{import set: {"extensions", "torch ms", "safeloader ms", "ratios": [first, second, third start]}}."""
    _compile_safeloader()
    results = {}
    for import_set in import_sets or list(IMPORT_SETS):
        samples: dict[str, list[dict]] = {"torch fork": [], "safeloader": []}
        for i in range(pairs):
            print(f"\r{import_set}: pair {i + 1}/{pairs}", end="", file=sys.stderr, flush=True)
            order = ("torch fork", "safeloader") if i % 2 == 0 else ("safeloader", "torch fork")
            for loader in order:
                samples[loader].append(_sample("torch" if loader == "torch fork" else loader, import_set, workers))
        print(file=sys.stderr)
        pairs_of = list(zip(samples["safeloader"], samples["torch fork"]))
        pair_ratios = [[s["times"][k] / t["times"][k] for s, t in pairs_of] for k in range(STARTS)]
        ratios = [statistics.median(r) for r in pair_ratios]
        results[import_set] = {
            "extensions": samples["safeloader"][0]["extensions"],
            "imported": samples["safeloader"][0]["imported"],
            "torch ms": [statistics.median(t["times"][k] for t in samples["torch fork"]) * 1e3 for k in range(STARTS)],
            "safeloader ms": [statistics.median(s["times"][k] for s in samples["safeloader"]) * 1e3
                              for k in range(STARTS)],
            "ratios": ratios,
            "intervals": [bootstrap_interval(r) for r in pair_ratios],
            "pair ratios": pair_ratios,
            # The fork system calls (the kernel's work, alike for both loaders) and the rest of a
            # start: what each loader's own code and its workers take, as a ratio of the pair's.
            "torch fork syscalls ms": [statistics.median(t["forks"][k] for t in samples["torch fork"]) * 1e3
                                       for k in range(STARTS)],
            "safeloader fork syscalls ms": [statistics.median(s["forks"][k] for s in samples["safeloader"]) * 1e3
                                            for k in range(STARTS)],
            "extra fork syscall ms": [statistics.median((s["forks"][k] - t["forks"][k]) * 1e3 for s, t in pairs_of)
                                      for k in range(STARTS)],
            "ratios without fork syscalls": [
                statistics.median((s["times"][k] - s["forks"][k]) / (t["times"][k] - t["forks"][k])
                                  for s, t in pairs_of)
                for k in range(STARTS)
            ],
            # Steadier than the times on a shared machine: the parent's CPU time and minor page
            # faults over torch's, medians of the pairs' differences.
            "extra cpu ms": [statistics.median((s["cpu"][k] - t["cpu"][k]) * 1e3 for s, t in pairs_of)
                             for k in range(STARTS)],
            "extra faults": [statistics.median(s["faults"][k] - t["faults"][k] for s, t in pairs_of)
                             for k in range(STARTS)],
            # The workers' CPU (all of them, fork to exit: one batch each, then shut down) over torch's.
            "extra workers cpu ms": [statistics.median((s["workers_cpu"][k] - t["workers_cpu"][k]) * 1e3
                                                       for s, t in pairs_of) for k in range(STARTS)],
        }
    return results


def print_results(results: dict, pairs: int, workers: int) -> None:
    rows = []
    for import_set, r in results.items():
        rows.append([import_set, str(r["extensions"]),
                     " / ".join(f"{ms:.0f}" for ms in r["torch ms"]),
                     " / ".join(f"{ms:.0f}" for ms in r["safeloader ms"]),
                     " / ".join(f"{x:.2f}x" for x in r["ratios"])])
    print(f"\nFresh process, {workers} workers, starts 1 / 2 / 3 to the first batch, "
          f"median of {pairs} alternating pairs:")
    print_table(rows, ["imports", "extension modules", "torch fork ms", "safeloader ms", "safeloader / torch"])
    print(f"\nThe same ratios with their 95% bootstrap intervals over the {pairs} pairs, against the goals"
          " (first start <= 1.10x, later starts <= 1.05x):")
    interval_rows = []
    for import_set, r in results.items():
        cells = [import_set]
        for k, (ratio, (low, high)) in enumerate(zip(r["ratios"], r["intervals"])):
            cells.append(f"{ratio:.2f}x [{low:.2f}, {high:.2f}] {verdict(low, high, 1.10 if k == 0 else 1.05)}")
        interval_rows.append(cells)
    print_table(interval_rows, ["imports", "first start", "second start", "third start"])
    print("\nos.fork() itself (the kernel copying the parent's page tables, the libraries' C at-fork handlers;"
          " the most variable part), the pairs' difference in it, and the rest of each start as a ratio:")
    print_table([[import_set, " / ".join(f"{ms:.0f}" for ms in r["torch fork syscalls ms"]),
                  " / ".join(f"{ms:.0f}" for ms in r["safeloader fork syscalls ms"]),
                  " / ".join(f"{ms:+.1f}" for ms in r["extra fork syscall ms"]),
                  " / ".join(f"{x:.2f}x" for x in r["ratios without fork syscalls"])]
                 for import_set, r in results.items()],
                ["imports", "torch fork() ms", "safeloader fork() ms", "difference ms", "rest: safeloader / torch"])
    print("\nThe parent's CPU time and minor page faults over torch's, and its workers' CPU over torch's workers'"
          " (fork to exit), medians of the pairs' differences:")
    print_table([[import_set, " / ".join(f"{ms:.1f}" for ms in r["extra cpu ms"]),
                  " / ".join(f"{n:.0f}" for n in r["extra faults"]),
                  " / ".join(f"{ms:.1f}" for ms in r["extra workers cpu ms"])] for import_set, r in results.items()],
                ["imports", "extra CPU ms", "extra faults", f"the {workers} workers' extra CPU ms"])
    print("targets: first start <= 1.10x, later starts <= 1.05x")
    missing = [name for import_set, r in results.items() for name in IMPORT_SETS[import_set]
               if name not in r["imported"]]
    if missing:
        print(f"not installed, so not imported: {', '.join(sorted(set(missing)))} (make bench-imports installs "
              "scikit-learn and OpenCV beside the .venv)")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--only", nargs="*", help="import sets to run (default: all)")
    parser.add_argument("--child", nargs=2, metavar=("LOADER", "IMPORTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], args.workers)
        return {}
    results = run(args.pairs, args.workers, args.only)
    print_results(results, args.pairs, args.workers)
    path = write_json("first_start", {"benchmark": "first_start", "workers": args.workers, "pairs": args.pairs,
                                      "results": results})
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
