"""Loaders started from 8 threads at once, each Dataset loading a shared library in the worker.

dlopen takes glibc's loader lock: a worker forked while another thread held
that lock in safeloader's ``before`` hooks hung there.

argv: rounds, ``safeloader`` or ``torch`` (whose DataLoader), and optionally
``walker``: a user hook walks the loaded libraries in ``before`` (what
forkstate's snapshot does), and ``warm``: one loader runs in the main thread
first, so that no thread still imports (and dlopens) an extension module
while another forks. Prints ``round <k> ok`` per round.
"""

import ctypes
import sys
import threading

import torch  # noqa: F401
from torch.utils.data import Dataset

import safeloader

rounds, which, *options = sys.argv[1:]
if which == "torch":
    from torch.utils.data import DataLoader

    keywords = {}
else:
    from safeloader import DataLoader

    # The watchdog on (the default's limit would leave too little of the test's time): a worker
    # that freezes is then named with its Python and native stacks, not only a timeout.
    keywords = {"stall_timeout": 40.0}


class LoadsALibrary(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ctypes.CDLL("libm.so.6")
        return i


def run(results, k):
    loader = DataLoader(LoadsALibrary(), batch_size=2, num_workers=2, **keywords)
    results[k] = [int(x) for batch in loader for x in batch]


if "walker" in options:
    from safeloader.forkstate import _dynamic_linker

    safeloader.register_at_fork(before=lambda: _dynamic_linker().loaded(), name="walker")

if "warm" in options:
    run({}, 0)

for round in range(int(rounds)):
    results = {}
    threads = [threading.Thread(target=run, args=(results, k)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[k] == list(range(8)) for k in range(8)), results
    print("round", round, "ok", flush=True)
