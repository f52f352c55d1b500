"""What the stall watchdog costs: the same loader with ``stall_timeout=None`` and on, side by side.

    python -m benchmarks.bench_watchdog [--items N] [--rounds R]

Contenders alternate round by round so machine noise hits both alike. Also
times one heartbeat (the per-item cost in the worker) and how long a stall
takes to be diagnosed and raised after its limit (stack collection and shutdown).
Writes benchmarks/results/watchdog.json.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

import safeloader
from safeloader import watchdog

from .common import write_json


class Tiny(torch.utils.data.Dataset):
    """Items that cost nothing to make, so the per-item overhead shows."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def epoch_seconds(items: int, stall_timeout: float | None) -> float:
    loader = safeloader.DataLoader(Tiny(items), batch_size=64, num_workers=2, stall_timeout=stall_timeout)
    start = time.perf_counter()
    count = sum(len(batch) for batch in loader)
    elapsed = time.perf_counter() - start
    assert count == items
    return elapsed


def heartbeat_seconds(repeats: int = 200_000) -> float:
    watch = watchdog.Watch(1, 60.0, "fork")
    beat = watchdog._Beat(watch, 0, None, -1)
    start = time.perf_counter()
    for _ in range(repeats):
        beat.item_done()
    return (time.perf_counter() - start) / repeats


def diagnosis_seconds(stall_timeout: float = 1.0) -> float:
    """Seconds from a worker's limit to the WorkerStallError (stacks collected, workers shut down)."""
    lock = threading.Lock()

    class Stuck(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> int:
            with lock:
                return index

    lock.acquire()
    try:
        loader = safeloader.DataLoader(Stuck(), num_workers=2, stall_timeout=stall_timeout)
        start = time.perf_counter()
        try:
            next(iter(loader))
        except watchdog.WorkerStallError:
            pass
        elapsed = time.perf_counter() - start
    finally:
        lock.release()
    return elapsed - stall_timeout * watchdog.FIRST_ITEM_FACTOR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    times: dict[str, list[float]] = {"off": [], "on": []}
    epoch_seconds(2_000, None)  # warm-up: imports, first fork
    for _ in range(args.rounds):
        for name, timeout in (("off", None), ("on", 60.0)):
            times[name].append(epoch_seconds(args.items, timeout))
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    beat = heartbeat_seconds()
    diagnosis = statistics.median(diagnosis_seconds() for _ in range(3))
    result = {
        "items": args.items,
        "rounds": args.rounds,
        "epoch_seconds_off": times["off"],
        "epoch_seconds_on": times["on"],
        "median_ratio_on_over_off": on / off,
        "heartbeat_microseconds": beat * 1e6,
        "diagnosis_seconds_after_limit": diagnosis,
    }
    print(f"{'contender':<22}{'median epoch':>14}{'ratio':>8}")
    print(f"{'stall_timeout=None':<22}{off:>12.3f} s{1.0:>8.3f}")
    print(f"{'stall_timeout=60':<22}{on:>12.3f} s{on / off:>8.3f}")
    print(f"one heartbeat (worker side, per item): {beat * 1e6:.2f} us")
    print(f"stall diagnosed and raised {diagnosis:.2f} s after the limit (2 stuck workers, native + Python stacks)")
    write_json("watchdog", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
