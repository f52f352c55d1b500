"""Child script: one worker is stopped (SIGSTOP) mid-epoch for 5 s while the main process runs on.

python -m tests.children.stopped_worker torch|safeloader [idle]  ->  prints one JSON line: the items
seen, the warnings raised while it was stopped and after it was continued, and the worker's pid.
With ``idle`` the main process first waits until the worker has done every batch it was given, so
that it is stopped idle, waiting for its next index: the loader then waits for the batch it cannot
begin (a worker stopped between two batches, where a Ctrl-Z or a debugger may find it).
"""

import json
import os
import signal
import sys
import threading
import time
import warnings

import torch

STOPPED_FOR = 5.0
IDLE_FIRST = sys.argv[2:] == ["idle"]


class SlowItems(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 200

    def __getitem__(self, index: int) -> int:
        time.sleep(0.01)
        return index


if sys.argv[1] == "torch":
    loader = torch.utils.data.DataLoader(SlowItems(), batch_size=4, num_workers=2)
else:
    import safeloader

    loader = safeloader.DataLoader(SlowItems(), batch_size=4, num_workers=2, stall_timeout=1.0)

seen: list[int] = []
caught: list[tuple[float, str]] = []  # (when, "Category: message") of each warning
stopped_at, continued_at = [float("inf")], [float("inf")]


def resume(pid: int) -> None:
    continued_at[0] = time.monotonic()
    os.kill(pid, signal.SIGCONT)


warnings.simplefilter("always")
warnings.showwarning = lambda message, category, *_, **__: caught.append(
    (time.monotonic(), f"{category.__name__}: {message}")
)
pid = 0
iterator = iter(loader)
for batch in iterator:
    seen.extend(batch.tolist())
    if len(seen) == 12:
        pid = iterator._workers[0].pid
        if IDLE_FIRST:
            time.sleep(1.0)  # its two batches in hand take 0.08 s: it waits for an index when stopped
        stopped_at[0] = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        threading.Timer(STOPPED_FOR, resume, args=(pid,)).start()
print(json.dumps({
    "items": sorted(seen) == list(range(200)),
    "pid": pid,
    "while_stopped": [text for when, text in caught if stopped_at[0] <= when < continued_at[0]],
    "after": [text for when, text in caught if when >= continued_at[0]],
}))
