"""A loader started while another thread of the parent holds glibc's exit-handler lock.

__cxa_atexit (a C++ static's first use registers its destructor through it) and
__cxa_finalize take that lock, and fork() does not make it new in the child: a
worker forked while another thread held it waits for ever at its first static
initialisation (torch's own worker does one: torch.set_num_threads(1) builds
torch's thread pool). The holder here is a thread in __cxa_finalize, called by
qsort as its comparison function, so that it runs without the GIL for seconds (the
loader starts once it is inside a sort):
each call takes the lock, then waits for glibc's fork-handler lock, which the
forking thread holds through the fork, so every fork finds the lock held. Each
item registers an exit handler, as a C++ library's first use in the worker would.

argv: ``torch`` or ``safeloader`` (whose DataLoader; with ``torch``, safeloader
is not imported). Prints ``items <list>`` and, for safeloader, ``held at fork
<list>``: whether the fork of each item's worker found the lock held.
"""

import ctypes
import sys
import threading
import time

import torch
from torch.utils.data import Dataset

which = sys.argv[1]
if which == "torch":
    from torch.utils.data import DataLoader
else:
    from safeloader import DataLoader, native

libc = ctypes.CDLL("libc.so.6")
register_exit_handler = libc["__cxa_atexit"]
COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
sorting = threading.Event()
done = threading.Event()


def hold_the_exit_handler_lock():
    # __cxa_finalize(handle) for handles no exit handler was registered with: each call takes
    # the lock, scans every exit handler registered (thousands, after importing torch), finds
    # nothing to run, and unregisters the handle's fork handlers (none).
    compare = ctypes.cast(libc["__cxa_finalize"], COMPARE)
    size, seconds = 256, 0.0
    while seconds < 0.5:  # sorts of 0.5 s or more: between two the thread waits for the GIL
        size *= 4
        handles = (ctypes.c_void_p * size)()
        start = time.perf_counter()
        libc.qsort(handles, size, ctypes.sizeof(ctypes.c_void_p), compare)
        seconds = time.perf_counter() - start
    while not done.is_set():
        sorting.set()
        libc.qsort(handles, size, ctypes.sizeof(ctypes.c_void_p), compare)


class RegistersAnExitHandler(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        register_exit_handler(libc.getpid, None, None)  # never run: workers leave through os._exit
        held = native.exit_handler_lock()[1] if which == "safeloader" else None
        return torch.tensor([i, int(bool(held))])


holder = threading.Thread(target=hold_the_exit_handler_lock)
holder.start()
sorting.wait()
time.sleep(0.05)  # the GIL free meanwhile: the holder is inside its sort now
try:
    batches = iter(DataLoader(RegistersAnExitHandler(), batch_size=2, num_workers=2))  # forks the workers
finally:
    done.set()  # the lock is free from here on: a worker that still waits for it waits for ever
    holder.join()
rows = [row for batch in batches for row in batch]
print("items", [int(r[0]) for r in rows], flush=True)
if which == "safeloader":
    print("held at fork", [bool(r[1]) for r in rows], flush=True)
