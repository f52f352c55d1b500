"""A sampler that handles its own signals inside ``iter(loader)`` (torch draws the first indices there).

argv: ``torch`` or ``safeloader`` (whose DataLoader), and ``alarm`` (the sampler bounds its search
with ``setitimer`` and a SIGALRM handler raising ``Timeout``, which it catches) or ``reload`` (it
sends itself SIGUSR1, whose handler raises ``Reload``, and catches that while it waits). Prints
JSON: how many times the handler ran, how many times the sampler caught its exception, what
iterating the loader raised (null for nothing) and the epoch's batches.
"""

import json
import os
import signal
import sys
import time

import torch

LOADER, MODE = sys.argv[1], sys.argv[2]
if LOADER == "torch":
    from torch.utils.data import DataLoader
else:
    from safeloader import DataLoader

SIGNUM = signal.SIGALRM if MODE == "alarm" else signal.SIGUSR1


class Timeout(Exception):
    pass


class Reload(Exception):
    pass


handled = []


def on_signal(signum, frame):
    handled.append(signum)
    raise Timeout if MODE == "alarm" else Reload


signal.signal(SIGNUM, on_signal)
caught = []


class SearchingSampler(torch.utils.data.Sampler):
    def __len__(self) -> int:
        return 8

    def __iter__(self):
        asked = time.monotonic()
        try:
            if MODE == "alarm":
                signal.setitimer(signal.ITIMER_REAL, 0.5)  # the search's own time bound
            else:
                os.kill(os.getpid(), signal.SIGUSR1)  # "reload" while it waits
            while time.monotonic() - asked < 30:  # the search (bounded here in case nothing comes)
                sum(range(1000))
                torch.utils.data.get_worker_info()  # torch's Python code, called by the sampler's
        except (Timeout, Reload):
            caught.append(MODE)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        yield from range(8)


loader = DataLoader(list(range(8)), batch_size=2, sampler=SearchingSampler(), num_workers=2)
raised = None
batches = []
try:
    for batch in loader:
        batches.append(batch.tolist())
except (Timeout, Reload) as error:
    raised = type(error).__name__
print(json.dumps({
    "handled": len(handled),
    "caught": len(caught),
    "raised": raised,
    "epoch": batches,
}))
