"""Per-fork cost of the "blosc2" and "pyav" hooks, and an epoch's time under each loader.

    python -m benchmarks.bench_c_pools [--workers 4] [--repeats 10]

The Dataset holds a blosc2 NDArray and SChunk (used in the parent with blosc2.set_nthreads(2))
and a PyAV container whose video stream decodes with thread_type "AUTO" (used in the parent).
Each of the two hooks' phases is timed inside the real worker forks (``before`` and
``after_in_parent`` in the parent, ``after_in_child`` in the worker), as bench_hook_cost does.
Then one epoch of 64 items is timed: safeloader's fork workers against torch's loader with
``multiprocessing_context="forkserver"`` and ``"spawn"`` on the same Dataset opening its files
in each worker instead (torch's fork workers hang on the one opened in __init__, and a blosc2
NDArray does not pickle), and ``num_workers=0``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import blosc2
import numpy as np
import torch

import safeloader

_seconds: dict[str, float] = {}


def _time_hooks(names: tuple[str, ...]) -> None:
    """Time each phase of the backends ``names``: their methods wrapped on the instance, re-registered."""
    from safeloader import backends

    def timed(key, callback):
        def run(*plan):  # `before` takes nothing and returns the plan; the after_* phases take it
            start = time.perf_counter()
            try:
                return callback(*plan)
            finally:
                _seconds[key] = _seconds.get(key, 0.0) + time.perf_counter() - start

        return run

    for name in names:
        backend = backends.get(name)
        for phase in ("before", "after_in_parent", "after_in_child"):
            setattr(backend, phase, timed(f"{name}.{phase}", getattr(backend, phase)))
        backend.register()


def write_arrays(directory: str) -> None:
    values = np.arange(64 * 20_000, dtype=np.float64).reshape(64, 20_000)
    blosc2.asarray(values, chunks=(1, 20_000), blocks=(1, 2_000), urlpath=f"{directory}/array.b2nd", mode="w")
    blosc2.SChunk(chunksize=160_000, data=values, cparams={"typesize": 8}, urlpath=f"{directory}/chunks.b2frame",
                  mode="w")


class Mixed(torch.utils.data.Dataset):
    """Item i: a row of a blosc2 array, a chunk of an SChunk and a decoded video frame, from files
    opened in __init__ (``lazy``: on the first item, in the worker: what torch's own loader needs)."""

    def __init__(self, directory: str, lazy: bool = False) -> None:
        self.directory = directory
        if not lazy:
            self._open()

    def _open(self) -> None:
        import av

        self.array = blosc2.open(f"{self.directory}/array.b2nd", mode="r")
        self.chunks = blosc2.open(f"{self.directory}/chunks.b2frame", mode="r")
        self.container = av.open(f"{self.directory}/clip.mp4")
        self.stream = self.container.streams.video[0]
        self.stream.thread_type = "AUTO"

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[int, float, dict[str, float]]:
        if "array" not in self.__dict__:
            self._open()
        total = float(self.array[index].sum()) + float(np.frombuffer(self.chunks.decompress_chunk(index)).sum())
        self.container.seek(0, stream=self.stream)
        for n, frame in enumerate(self.container.decode(self.stream)):
            if n == index % 48:
                total += float(frame.to_ndarray().sum())
                break
        return os.getpid(), total, dict(_seconds)


def _epoch(loader) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    from tests.pyav_data import write_video

    blosc2.set_nthreads(2)
    _time_hooks(("blosc2", "pyav"))
    with tempfile.TemporaryDirectory() as directory:
        write_video(Path(directory) / "clip.mp4")
        write_arrays(directory)
        dataset = Mixed(directory)
        lazy = Mixed(directory, lazy=True)
        expected = [dataset[i][1] for i in range(len(dataset))]
        per_fork: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            _seconds.clear()
            loader = safeloader.DataLoader(dataset, batch_size=None, num_workers=args.workers)
            items = list(loader)
            assert [total for _, total, _ in items] == expected
            children = {pid: seconds for pid, _, seconds in items}
            for key in ("blosc2.before", "blosc2.after_in_parent", "pyav.before", "pyav.after_in_parent"):
                per_fork.setdefault(key, []).append(_seconds.get(key, 0.0) / args.workers)
            for key in ("blosc2.after_in_child", "pyav.after_in_child"):
                per_fork.setdefault(key, []).append(statistics.median(s.get(key, 0.0) for s in children.values()))
        print(f"per worker fork, median over {args.repeats} loaders x {args.workers} workers:")
        for key, values in per_fork.items():
            print(f"  {key:<24} {statistics.median(values) * 1e3:8.3f} ms")
        loaders = {
            "safeloader fork": lambda: safeloader.DataLoader(dataset, batch_size=None, num_workers=args.workers),
            "torch forkserver": lambda: torch.utils.data.DataLoader(
                lazy, batch_size=None, num_workers=args.workers, multiprocessing_context="forkserver"),
            "torch spawn": lambda: torch.utils.data.DataLoader(
                lazy, batch_size=None, num_workers=args.workers, multiprocessing_context="spawn"),
            "num_workers=0": lambda: torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0),
        }
        print("one epoch (64 items), median of 3 (workers started in each):")
        for name, make in loaders.items():
            print(f"  {name:<18} {statistics.median(_epoch(make()) for _ in range(3)) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
