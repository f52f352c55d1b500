"""Ctrl-C while a loader starts: the sampler's iterator (run by torch once the workers are
forked, to hand them their first indices) raises SIGINT at its first index.

argv: ``torch`` or ``safeloader``, and ``once`` (one Ctrl-C), ``twice`` (two in a row),
``replace`` (the sampler installs its own SIGINT handler, then one Ctrl-C) or ``hang`` (one
Ctrl-C, then the sampler blocks for 60 s: a start that does not end). Prints JSON: how
many indices the sampler yielded before the KeyboardInterrupt reached the caller, the worker
processes still alive 5 s later, whether SIGINT's handler is Python's own (or the sampler's)
again, and the next epoch's batches.
"""

import json
import signal
import sys
import time

import torch

from tests.children.workers_left import workers_left

LOADER, MODE = sys.argv[1], sys.argv[2]
if LOADER == "torch":
    from torch.utils.data import DataLoader
else:
    from safeloader import DataLoader

yielded = []
first = [True]


def own_handler(signum, frame):
    raise KeyboardInterrupt


class Sampler(torch.utils.data.Sampler):
    def __len__(self) -> int:
        return 8

    def __iter__(self):
        if first[0]:
            first[0] = False
            if MODE == "replace":
                signal.signal(signal.SIGINT, own_handler)
            for _ in range(2 if MODE == "twice" else 1):
                signal.raise_signal(signal.SIGINT)
            if MODE == "hang":
                time.sleep(60)
        for index in range(8):
            yielded.append(index)
            yield index


loader = DataLoader(list(range(8)), batch_size=2, sampler=Sampler(), num_workers=2)
started = time.monotonic()
try:
    iter(loader)
    raised = False
except KeyboardInterrupt:
    raised = True
count = len(yielded)
seconds = time.monotonic() - started


left = workers_left()
handler = signal.getsignal(signal.SIGINT)
names = {signal.default_int_handler: "python", own_handler: "own"}
print(json.dumps({
    "raised": raised,
    "yielded before": count,
    "workers left": len(left),
    "within 10 s": seconds < 10,
    "handler": names.get(handler, repr(handler)),
    "next epoch": [batch.tolist() for batch in loader],
}))
