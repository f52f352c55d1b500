"""torch's bundled GNU OpenMP: the parent runs a parallel region, a worker raises its thread
count and runs one (safeloader's threadpools backend disabled).

argv: ``torch`` or ``safeloader`` (whose DataLoader). Prints the items, or ``STALL <report>``.
"""

import sys

import torch
from torch.utils.data import Dataset

import safeloader

LOADER = sys.argv[1]
torch.set_num_threads(2)
torch.ones(2_000_000).sum()  # a parallel region in the parent


class Parallel(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        torch.set_num_threads(2)
        return float(torch.ones(2_000_000).sum())


if LOADER == "torch":
    from torch.utils.data import DataLoader

    kwargs = {}
else:
    from safeloader import DataLoader

    # Forked anyway (the live OpenMP pool would start forkserver workers): the stall report is what this shows.
    kwargs = {"stall_timeout": 2.0, "disable_hooks": ("threadpools",), "on_unsafe_fork": "warn"}
try:
    print(list(DataLoader(Parallel(), num_workers=1, **kwargs)))
except safeloader.WorkerStallError as error:
    print("STALL", str(error))
