"""A collate_fn taking 3 s per batch of 4 (or hanging), with stall_timeout=2.

argv: ``hang`` or ``slow``. Prints ``complete``, or ``STALL`` and the error's second line.
"""

import sys
import time

import torch  # noqa: F401
from torch.utils.data import default_collate

import safeloader
from safeloader import DataLoader

HANG = sys.argv[1] == "hang"


def slow_collate(batch):
    time.sleep(3600 if HANG else 3.0)
    return default_collate(batch)


loader = DataLoader(list(range(16)), batch_size=4, num_workers=2, collate_fn=slow_collate, stall_timeout=2.0)
try:
    out = [int(x) for b in loader for x in b]
except safeloader.WorkerStallError as error:
    print("STALL", str(error).splitlines()[1])
else:
    assert out == list(range(16)), out
    print("complete")
