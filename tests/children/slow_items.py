"""An epoch of 64 slow items (0.25 s each, 2 workers): about 8 s, long enough to be stopped mid-epoch.

argv: ``torch`` or ``safeloader`` (whose DataLoader; safeloader's with stall_timeout=1); then
``forkserver`` for workers of a forkserver (not this process's children: the kernel cannot tell it
they were continued).
Prints ``started`` before the loader starts, ``complete`` once every item came back in order.
"""

import sys
import time

import torch  # noqa: F401
from torch.utils.data import Dataset

import safeloader  # noqa: F401

LOADER = sys.argv[1]


class Slow(Dataset):
    def __len__(self):
        return 64  # 8 s with 2 workers: the stop at 3 s lands mid-epoch

    def __getitem__(self, i):
        time.sleep(0.25)
        return i


if __name__ == "__main__":  # a forkserver's workers import this module
    if LOADER == "torch":
        from torch.utils.data import DataLoader

        kwargs = {}
    else:
        from safeloader import DataLoader

        kwargs = {"stall_timeout": 1.0}
    if sys.argv[2:] == ["forkserver"]:
        kwargs["multiprocessing_context"] = "forkserver"
    print("started", flush=True)
    out = [int(x) for batch in DataLoader(Slow(), batch_size=2, num_workers=2, **kwargs) for x in batch]
    assert out == list(range(64)), out
    print("complete", flush=True)
