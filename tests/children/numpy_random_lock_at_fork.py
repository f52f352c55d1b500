"""A parent thread draws from numpy's global RandomState (np.random.*: its lock held with the GIL
released) while the main thread's loader forks its workers.

A worker inherits the lock held by a thread it does not have: torch's worker loop waits forever in
its ``np.random.seed``. argv: ``torch``, ``safeloader``, or ``torch-off`` (safeloader with its
"torch" backend disabled: the stall report must name the lock). Prints the items' indices, whether
each worker's numpy draw was in range and whether the two workers drew differently (torch seeds each
one's generator), then ``done``; ``STALL`` and the report where the watchdog stopped the workers.
"""

import sys
import threading
import time

import numpy as np
import torch

import safeloader

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
        info = torch.utils.data.get_worker_info()
        return i, info.id, int(np.random.randint(0, 1000))  # the worker's global generator works too


drawing, stop = threading.Event(), threading.Event()


def draw():
    while not stop.is_set():
        drawing.set()
        np.random.random(20_000_000)  # about 0.1 s each, holding the global RandomState's lock


thread = threading.Thread(target=draw, daemon=True)
thread.start()
drawing.wait()
# Fork while the lock is held, not in a gap between two draws: wait until this thread cannot take it.
lock = np.random.mtrand._rand._bit_generator.lock
deadline = time.monotonic() + 10
while lock.acquire(blocking=False) and time.monotonic() < deadline:
    lock.release()
    time.sleep(0.001)
loader = DataLoader(Draws(), batch_size=1, num_workers=2, **OPTIONS[sys.argv[1]])
try:
    batches = iter(loader)  # the workers are forked here
    # Drawing stops once they are: the lock they inherited stays as it was at their fork, and a
    # parent that no longer works lets the test see torch's hang within seconds (tests/subproc.py).
    stop.set()
    batches = [(int(index), int(worker), int(value)) for index, worker, value in batches]
except safeloader.WorkerStallError as error:
    print("STALL", error, flush=True)
    sys.exit(0)
finally:
    stop.set()
draws = {worker: [value for _, w, value in batches if w == worker] for worker in (0, 1)}
print(sorted(index for index, _, _ in batches), all(0 <= value < 1000 for _, _, value in batches),
      draws[0] != draws[1], flush=True)
print("done", flush=True)
