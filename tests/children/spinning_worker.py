"""A worker that runs without progress, and slow items that progress: told apart within seconds.

argv: ``torch`` or ``safeloader`` (whose DataLoader: 2 workers, defaults; safeloader's with
``on_unsafe_fork='warn'``), then the Dataset:

- ``zmq``: a pyzmq socket pair made in ``__init__`` and used once in the parent; each item sends and
  receives a message. A forked worker's calls on the parent's context fail with EINTR, which pyzmq
  retries for ever at full CPU (torch's loader spins there without a word).
- ``numpy``: items computing for 8 s each in numpy (matrix products, then a ``np.vectorize`` whose
  Python function numpy's C code calls back), the parent's OpenBLAS threads live; stall_timeout=30.

Prints the items, or the error's type and message; the seconds from the loader's creation to the
error on stderr.
"""

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


if __name__ == "__main__":
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
        print(sorted(loader), flush=True)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        print(f"error after {time.monotonic() - started:.1f} s", file=sys.stderr)
