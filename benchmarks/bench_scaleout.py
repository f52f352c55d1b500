"""Cost of the pin_memory fork gate: loader start-up with and without it, idle and next to a busy pin thread.

    python -m benchmarks.bench_scaleout [--workers 4] [--repeats 20] [--pin-ms 2]

Contenders alternate. "busy pin thread" runs torch's own pin-memory loop (as
a training loader with pin_memory=True does) on batches whose pinning takes
``--pin-ms`` with the GIL released, like a host-to-pinned copy; the gate makes
each worker fork wait for the pinning in progress, so its cost is at most
``workers x pin-ms`` per loader start. The idle case is the gate's bookkeeping alone.
"""

from __future__ import annotations

import argparse
import queue
import threading
import time

import torch
import torch.utils.data._utils.pin_memory as pin_module

import safeloader

from .common import alternate, print_table, summarize, timed, write_json


class Trivial(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        return index


class SlowPin:
    """A batch whose pinning takes ``seconds`` of GIL-free time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def pin_memory(self) -> SlowPin:
        time.sleep(self.seconds)
        return self


def first_batch(disable: tuple[str, ...], workers: int) -> float:
    def run() -> None:
        iterator = iter(safeloader.DataLoader(Trivial(), batch_size=8, num_workers=workers, disable_hooks=disable))
        next(iterator)
        del iterator

    return timed(run)


def start_busy_pin_thread(pin_seconds: float) -> tuple[threading.Event, list[int]]:
    torch.accelerator.set_device_index = lambda index: None  # CPU-only torch: the loop's only device call
    done = threading.Event()
    in_queue: queue.Queue = queue.Queue(2)
    out_queue: queue.Queue = queue.Queue()
    pinned = [0]
    threading.Thread(target=pin_module._pin_memory_loop, args=(in_queue, out_queue, 0, done, "cpu"),
                     daemon=True).start()

    def feed() -> None:
        while not done.is_set():
            try:
                in_queue.put((0, SlowPin(pin_seconds)), timeout=0.1)
            except queue.Full:
                pass
            while not out_queue.empty():
                out_queue.get()
                pinned[0] += 1

    threading.Thread(target=feed, daemon=True).start()
    return done, pinned


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--pin-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    n = args.workers
    contenders = {
        "gate": lambda: first_batch((), n),
        "no gate": lambda: first_batch(("pin_memory",), n),
    }
    first_batch((), n)  # installs the gate, warms up
    idle = alternate(contenders, args.repeats, progress="idle")
    done, pinned = start_busy_pin_thread(args.pin_ms / 1000)
    busy = alternate(contenders, args.repeats, progress="busy pin thread")
    done.set()
    results = {f"{name}, {phase}": summarize(samples[name])
               for phase, samples in (("idle", idle), ("busy pin thread", busy)) for name in contenders}
    rows = [[name, f"{r['median'] * 1000:.1f}", f"{r['min'] * 1000:.1f}", f"{r['max'] * 1000:.1f}"]
            for name, r in results.items()]
    print(f"\nTime to first batch, {n} workers, median of {args.repeats}, pinning {args.pin_ms:g} ms per batch:")
    print_table(rows, ["contender", "median ms", "min ms", "max ms"])
    ratios = {
        phase: results[f"gate, {phase}"]["median"] / results[f"no gate, {phase}"]["median"]
        for phase in ("idle", "busy pin thread")
    }
    for phase, ratio in ratios.items():
        print(f"gate / no gate, {phase}: {ratio:.3f}")
    print(f"batches pinned meanwhile: {pinned[0]}")
    payload = {"benchmark": "scaleout", "workers": n, "pin_ms": args.pin_ms, "results": results,
               "ratios": {"gate_vs_no_gate_" + phase.replace(" ", "_"): r for phase, r in ratios.items()}}
    path = write_json("scaleout", payload)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
