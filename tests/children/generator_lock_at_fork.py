"""A parent thread draws random numbers (torch's default CPU generator, its lock held with the
GIL released) while the main thread's loader forks its workers.

A worker inherits the lock held by a thread it does not have: torch's worker loop waits forever
in its first ``torch.manual_seed``. argv: ``torch``, ``safeloader``, or ``torch-off``
(safeloader with its "torch" backend disabled: the stall report must name the lock). Prints the
items' indices and whether each worker's random draw was in range, then ``done``; ``STALL`` and the
report where the watchdog stopped the workers.
"""

import ctypes
import os
import sys
import threading
import time

import torch

# Each fork while the lock is held, not in a gap between two draws (on a loaded machine the main
# thread can otherwise take the GIL back between them, or a draw end while safeloader's hooks run):
# wait until glibc's __lock word says it is held, in the last `before` callback to run before each
# fork (registered before safeloader is imported: os.register_at_fork runs `before` callbacks
# last-registered first).
lock_word = None
stop = threading.Event()


def until_the_lock_is_held():
    deadline = time.monotonic() + 10
    while (
        not stop.is_set()
        and lock_word is not None
        and ctypes.c_int.from_address(lock_word).value == 0
        and time.monotonic() < deadline
    ):
        time.sleep(0.001)  # the GIL released: the drawing thread starts its next draw


os.register_at_fork(before=until_the_lock_is_held)

import safeloader  # noqa: E402
from safeloader.backends.torch_state import BACKEND as TORCH_BACKEND  # noqa: E402

DataLoader = torch.utils.data.DataLoader if sys.argv[1] == "torch" else safeloader.DataLoader
OPTIONS = {
    "torch": {},
    "safeloader": {"stall_timeout": 30},
    "torch-off": {"stall_timeout": 5, "disable_hooks": ("torch",)},
}


class Draws(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i, int(torch.randint(0, 1000, ()).item())  # the worker's generator works too


drawing = threading.Event()
values = torch.empty(100_000_000)


def draw():
    while not stop.is_set():
        drawing.set()
        values.uniform_()  # about 0.5 s each, holding the default generator's lock


thread = threading.Thread(target=draw, daemon=True)
thread.start()
drawing.wait()
lock_word = TORCH_BACKEND.generator_lock.address()
loader = DataLoader(Draws(), batch_size=1, num_workers=2, **OPTIONS[sys.argv[1]])
try:
    batches = iter(loader)  # the workers are forked here
    # Drawing stops once they are: the lock they inherited stays as it was at their fork, and a
    # parent that no longer works lets the test see torch's hang within seconds (tests/subproc.py).
    stop.set()
    batches = [(int(index), int(value)) for index, value in batches]
except safeloader.WorkerStallError as error:
    print("STALL", error, flush=True)
    sys.exit(0)
finally:
    stop.set()
print(sorted(index for index, _ in batches), all(0 <= value < 1000 for _, value in batches), flush=True)
print("done", flush=True)
