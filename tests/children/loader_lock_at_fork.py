"""A parent thread sits inside dl_iterate_phdr (glibc's loader lock held; its callback sleeps)
while the workers fork, and each item dlopens a library.

argv: ``torch`` or ``safeloader`` (whose DataLoader). Prints the epoch's batches,
or ``STALL <report>``.
"""

import ctypes
import os
import sys
import threading
import time

import torch  # noqa: F401
from torch.utils.data import Dataset

import safeloader

LOADER = sys.argv[1]


class LoadsALibrary(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        ctypes.CDLL("libm.so.6")
        return i


if LOADER == "torch":
    from torch.utils.data import DataLoader

    kwargs = {}
else:
    from safeloader import DataLoader

    kwargs = {"stall_timeout": 2.0}
loader = DataLoader(LoadsALibrary(), num_workers=1, **kwargs)
list(loader)  # a first epoch: whatever starting workers loads is loaded now

libc = ctypes.CDLL(None)
callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
inside = threading.Event()


def visit(info, size, data):
    inside.set()
    time.sleep(8)  # holds the loader lock meanwhile
    return 1


walker = threading.Thread(target=lambda: libc.dl_iterate_phdr(callback_type(visit), None), daemon=True)
walker.start()
inside.wait()
try:
    print(list(loader))
except safeloader.WorkerStallError as error:
    print("STALL", str(error))
os._exit(0)  # the walker thread still sleeps inside the loader
