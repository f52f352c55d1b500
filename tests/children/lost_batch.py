"""A batch the worker's result queue cannot send: pickling fails with EMFILE in the queue's
feeder thread (as when tensors' descriptors run out); multiprocessing prints it and drops it.

argv: ``torch`` or ``safeloader`` (whose DataLoader). Prints ``RAISED <type> <error>`` if the loader raises.
"""

import errno
import sys

from torch.utils.data import Dataset

LOADER = sys.argv[1]


class Unsendable:
    def __reduce__(self):
        raise OSError(errno.EMFILE, "Too many open files")


class D(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return Unsendable() if i == 2 else i


if LOADER == "torch":
    from torch.utils.data import DataLoader
else:
    from safeloader import DataLoader
try:
    list(DataLoader(D(), batch_size=None, num_workers=1))
except Exception as error:
    print("RAISED", type(error).__name__, error)
