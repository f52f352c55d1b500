"""Another thread forks while a loader runs, and is held inside its own at-fork callback.

argv: ``torch`` or ``safeloader`` (whose DataLoader runs the epochs); the case:

- ``slow``: the other thread's ``before`` callback lasts until the main thread has run its
  epochs (an Event, with a 60 s cap): a loader that waits for another thread's fork cannot
  finish an epoch meanwhile.
- ``rlock``: the other thread's ``before`` callback takes an RLock that a third thread holds
  until the main thread has run its epochs: a loader that waits for that fork deadlocks.
- ``timing``: the other thread forks in a loop, its callbacks sleeping 0.5 s each; prints
  each epoch's seconds (for the record, not asserted).

The callbacks are registered after torch is imported and before safeloader is: they
run outside the standard library's own (concurrent.futures takes a lock in its
``before``, which would serialise every fork, torch's too) and inside safeloader's
(``before`` callbacks run in reverse order of registration, the others in order). They
act only in the other thread's forks. The torch run does not import safeloader.
Prints one JSON line: ``epochs`` (items per epoch), ``in_callback_after`` (whether the
other thread was still inside its callback when the epochs were done), ``seconds``.
"""

import json
import os
import sys
import threading
import time

import torch  # noqa: F401  (imported first: its stdlib at-fork callbacks are registered before ours)
from torch.utils.data import Dataset

LOADER, CASE = sys.argv[1], sys.argv[2]
EPOCHS = 3

epochs_done = threading.Event()
lock = threading.RLock()
inside = threading.Event()
forker: threading.Thread | None = None


def before() -> None:
    if threading.current_thread() is not forker:
        return
    inside.set()
    if CASE == "slow":
        epochs_done.wait(60)
    elif CASE == "rlock":
        with lock:
            pass
    else:
        time.sleep(0.5)
    inside.clear()


def after_in_parent() -> None:
    if threading.current_thread() is forker and CASE == "timing":
        time.sleep(0.5)


os.register_at_fork(before=before, after_in_parent=after_in_parent)

if LOADER == "safeloader":
    from safeloader import DataLoader
else:
    from torch.utils.data import DataLoader


class Items(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        return index


def fork_once() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def fork_loop() -> None:
    while not epochs_done.is_set():
        fork_once()


holder_ready = threading.Event()


def hold_lock() -> None:
    with lock:
        holder_ready.set()
        epochs_done.wait(60)


if CASE == "rlock":
    threading.Thread(target=hold_lock, daemon=True).start()
    holder_ready.wait()
forker = threading.Thread(target=fork_loop if CASE == "timing" else fork_once, daemon=True)
forker.start()
if CASE != "timing":
    inside.wait()  # the other thread is inside its callback, inside its fork
seconds, counts = [], []
for _ in range(EPOCHS):
    start = time.monotonic()
    counts.append(sum(len(batch) for batch in DataLoader(Items(), batch_size=4, num_workers=2)))
    seconds.append(round(time.monotonic() - start, 3))
still_inside = inside.is_set()
epochs_done.set()
forker.join(70)
print(json.dumps({"epochs": counts, "in_callback_after": still_inside, "seconds": seconds}), flush=True)
