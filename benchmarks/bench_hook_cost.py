"""Per-fork cost of safeloader's hooks, timed inside the fork itself, with backend libraries imported.

    python -m benchmarks.bench_hook_cost [--workers 4] [--repeats 10] [--without sockets lmdb fsspec]

Unlike the difference of two first-batch medians (bench_startup), which a
busy machine drowns in noise, this times the three hook phases of each real
worker fork (``before`` and ``after_in_parent`` in the parent,
``after_in_child`` in the worker) and reports the median sum per worker, in
wall time and in CPU time (the thread's own: on a loaded machine wall time
also counts the time the OS ran other processes instead).
Every library with a backend that is installed is imported first, and the
Dataset holds an HTTP keep-alive session, an fsspec filesystem and an LMDB
environment, so each hook has something to do.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import tempfile
import time

import torch

import safeloader

LIBRARIES = ("numpy", "h5py", "zarr", "zarrs", "threadpoolctl", "requests", "fsspec", "fsspec.asyn", "lmdb", "polars")


def import_backend_libraries() -> list[str]:
    """Import every installed library that has a backend; returns those imported."""
    imported = []
    for name in LIBRARIES:
        try:
            importlib.import_module(name)
            imported.append(name)
        except ImportError:
            pass
    return imported


class Handles:
    """What a Dataset typically holds, so each hook has something to do at a fork:
    an LMDB environment (``directory/db``), an HTTP keep-alive session and an fsspec filesystem."""

    def __init__(self, directory: str) -> None:
        import lmdb

        with lmdb.open(f"{directory}/db", map_size=1 << 20) as env, env.begin(write=True) as txn:
            txn.put(b"k", b"v")
        self.env = lmdb.open(f"{directory}/db", readonly=True)
        import fsspec
        import requests

        self.session = requests.Session()
        self.fs = fsspec.filesystem("http")

_phase_seconds: dict[str, float] = {}
_phase_cpu: dict[str, float] = {}  # the same phases, CPU time of the forking (or worker's) thread
_hook_seconds: dict[str, float] = {}  # hook name -> seconds, all phases


def _time_each_hook() -> None:
    """Register every hook again (same name, order, requires...) with its callbacks timed."""

    def timed(name, callback):
        if callback is None:
            return None

        def run():
            start = time.perf_counter()
            try:
                callback()
            finally:
                _hook_seconds[name] = _hook_seconds.get(name, 0.0) + time.perf_counter() - start

        return run

    for hook in safeloader.hooks():  # in run order, which registering again in that order keeps
        safeloader.register_at_fork(
            before=timed(hook.name, hook.before), after_in_parent=timed(hook.name, hook.after_in_parent),
            after_in_child=timed(hook.name, hook.after_in_child), name=hook.name, first=hook.first,
            last=hook.last, runs_after=hook.runs_after, every_fork=hook.every_fork, requires=hook.requires,
            description=hook.description, replace=True)


def _time_each_phase() -> None:
    """Two hooks around all others time each phase whole, the registry's dispatch included:
    ``after_*`` run from the first hook to the last, ``before`` the other way round."""
    started: dict[str, tuple[float, float]] = {}

    def start(phase):
        def run():
            started[phase] = (time.perf_counter(), time.thread_time())

        return run

    def stop(phase):
        def run():
            wall, cpu = started.pop(phase)
            _phase_seconds[phase] = _phase_seconds.get(phase, 0.0) + time.perf_counter() - wall
            _phase_cpu[phase] = _phase_cpu.get(phase, 0.0) + time.thread_time() - cpu

        return run

    safeloader.register_at_fork(before=start("before"), after_in_parent=stop("after_in_parent"),
                                after_in_child=stop("after_in_child"), name="bench.last", last=True)
    safeloader.register_at_fork(before=stop("before"), after_in_parent=start("after_in_parent"),
                                after_in_child=start("after_in_child"), name="bench.first", first=True)


class Holder(Handles, torch.utils.data.Dataset):
    """Holds the handles; item: (worker pid, its after_in_child wall and CPU seconds, per-hook seconds)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[int, float, float, dict[str, float]]:
        return (os.getpid(), _phase_seconds.get("after_in_child", 0.0), _phase_cpu.get("after_in_child", 0.0),
                dict(_hook_seconds))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--without", nargs="*", default=[], help="hooks to disable (to compare)")
    args = parser.parse_args(argv)
    imported = import_backend_libraries()
    _time_each_hook()
    _time_each_phase()
    per_worker = []
    per_worker_cpu = []
    per_hook: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        dataset = Holder(directory)
        for _ in range(args.repeats):
            _phase_seconds.clear()
            _phase_cpu.clear()
            _hook_seconds.clear()
            loader = safeloader.DataLoader(dataset, batch_size=None, num_workers=args.workers,
                                           disable_hooks=tuple(args.without))
            items = {pid: (seconds, cpu, hooks) for pid, seconds, cpu, hooks in loader}  # one per worker
            child = [seconds for seconds, _, _ in items.values()]
            child_cpu = [cpu for _, cpu, _ in items.values()]
            for _, _, hooks in items.values():
                for name, seconds in hooks.items():
                    per_hook.setdefault(name, []).append(seconds + _hook_seconds.get(name, 0.0) / args.workers)
            parent = _phase_seconds.get("before", 0.0) + _phase_seconds.get("after_in_parent", 0.0)
            per_worker.append(parent / args.workers + statistics.median(child))
            parent_cpu = _phase_cpu.get("before", 0.0) + _phase_cpu.get("after_in_parent", 0.0)
            per_worker_cpu.append(parent_cpu / args.workers + statistics.median(child_cpu))
    median = statistics.median(per_worker)
    print(f"imported: {', '.join(imported)}; pid {os.getpid()}")
    timed = [h.name for h in safeloader.hooks()
             if h.active and h.name not in args.without and not h.name.startswith("bench.")]
    print(f"hooks: {', '.join(timed)}")
    print(f"hook time per worker fork: median {median * 1e3:.3f} ms, min {min(per_worker) * 1e3:.3f} ms, "
          f"max {max(per_worker) * 1e3:.3f} ms over {args.repeats} loaders x {args.workers} workers")
    print(f"CPU time per worker fork:  median {statistics.median(per_worker_cpu) * 1e3:.3f} ms, "
          f"min {min(per_worker_cpu) * 1e3:.3f} ms, max {max(per_worker_cpu) * 1e3:.3f} ms")
    for name, values in sorted(per_hook.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  {name:<12} {statistics.median(values) * 1e3:8.3f} ms")
    return {"per_worker_s": per_worker, "median_s": median, "per_worker_cpu_s": per_worker_cpu,
            "median_cpu_s": statistics.median(per_worker_cpu),
            "per_hook_median_s": {name: statistics.median(v) for name, v in per_hook.items()}}


if __name__ == "__main__":
    main()
