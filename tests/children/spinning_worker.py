"""A worker that runs without progress, and slow items that progress: told apart within seconds.

argv: ``torch`` or ``safeloader`` (whose DataLoader: 2 workers, defaults; safeloader's with
``on_unsafe_fork='warn'``), then the Dataset:

- ``zmq``: a pyzmq socket pair made in ``__init__`` and used once in the parent; each item sends and
  receives a message. A forked worker's calls on the parent's context fail with EINTR, which pyzmq
  retries for ever at full CPU (torch's loader spins there without a word).
- ``numpy``: items computing for 8 s each in numpy (matrix products, then a ``np.vectorize`` whose
  Python function numpy's C code calls back), the parent's OpenBLAS threads live; stall_timeout=30.
  OpenBLAS stops its threads at every fork (its own fork handler), so the parent runs a matrix product
  once the workers are forked: its threads are then live, and asleep (attributed), when the watchdog
  looks at the busy workers. On stderr, a line ``samplings: {...}`` says what the spin detector did:
  samplings with numpy's OpenBLAS among the parent's live libraries, samples taken, samples that found
  numpy's C code calling back into the interpreter, spins named.

Prints the items, or the error's type and message; the seconds from the loader's creation to the
error on stderr.
"""

import json
import sys
import time

import numpy as np
import torch

import safeloader

which, kind = sys.argv[1:]


class Messages(torch.utils.data.Dataset):
    def __init__(self) -> None:
        import zmq

        self.context = zmq.Context()
        self.receiver = self.context.socket(zmq.PAIR)
        port = self.receiver.bind_to_random_port("tcp://127.0.0.1")
        self.sender = self.context.socket(zmq.PAIR)
        self.sender.connect(f"tcp://127.0.0.1:{port}")

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        self.sender.send(b"item %d" % index)
        return len(self.receiver.recv())


def _half(x: float) -> float:
    return x / 2


class SlowNumpy(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> float:
        matrix = np.random.default_rng(index).random((300, 300))
        end = time.monotonic() + 4
        while time.monotonic() < end:
            matrix = matrix @ matrix.T
            matrix /= np.abs(matrix).max()
        halves = np.vectorize(_half)
        end = time.monotonic() + 4
        while time.monotonic() < end:
            halves(np.arange(200_000.0))
        return float(index)


def count_samplings() -> dict[str, int]:
    """What the spin detector does in this process (the workers' parent), counted around its two
    functions: the test checks that the path it names ran, not only that nothing was reported."""
    from safeloader.diagnostics import spin_samples

    counts = {"samplings": 0, "samples": 0, "numpy_callbacks": 0, "spins": 0}
    spinning_in, loop_library = spin_samples.spinning_in, spin_samples.loop_library

    def counted_loop_library(frames):  # type: ignore[no-untyped-def]
        library = loop_library(frames)
        counts["samples"] += 1
        counts["numpy_callbacks"] += library is not None and "/numpy/" in library
        return library

    def counted_spinning_in(sample, live):  # type: ignore[no-untyped-def]
        if sample is not None and any("openblas" in path for path in live):
            counts["samplings"] += 1
        package = spinning_in(sample, live)
        counts["spins"] += package is not None
        return package

    spin_samples.spinning_in, spin_samples.loop_library = counted_spinning_in, counted_loop_library
    return counts


if __name__ == "__main__":
    counts = count_samplings() if which == "safeloader" and kind == "numpy" else None
    if kind == "zmq":
        dataset, keywords = Messages(), {"on_unsafe_fork": "warn"}
        assert dataset[0] == 6  # the parent's context is live: its I/O thread runs
    else:
        dataset, keywords = SlowNumpy(), {"stall_timeout": 30.0}
        np.ones((500, 500)) @ np.ones((500, 500))  # the parent's BLAS threads ran
    started = time.monotonic()
    try:
        if which == "torch":
            loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
        else:
            loader = safeloader.DataLoader(dataset, batch_size=None, num_workers=2, **keywords)
        iterator = iter(loader)  # the workers fork (OpenBLAS's fork handler stops the parent's threads)
        if kind == "numpy":
            np.ones((500, 500)) @ np.ones((500, 500))  # the parent's BLAS threads live again, then asleep
        print(sorted(iterator), flush=True)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        print(f"error after {time.monotonic() - started:.1f} s", file=sys.stderr)
    if counts is not None:
        print(f"samplings: {json.dumps(counts)}", file=sys.stderr)
