"""Signals the user holds, under safeloader's DataLoader or torch's.

argv: ``torch`` or ``safeloader``; the case:

- ``workers``: the parent installs a Python handler on SIGRTMIN+2 and registers faulthandler on
  SIGRTMIN+3 (into a file) before the loader; each item sends both signals to its own worker.
- ``init``: the same two, installed in ``worker_init_fn`` instead.
- ``parent``: the parent registers faulthandler on SIGRTMIN+2 and SIGRTMIN+3, holds a live
  polars pool (which makes safeloader look at its threads' native stacks before forking,
  with the polars backend off), runs two loaders, then sends both signals to itself.
- ``stall``: the parent holds both signals as in ``workers``, and ``worker_init_fn`` takes
  SIGRTMAX-1 too (a signal the worker had found free when it was forked); item 5 hangs.
  safeloader must name the hang with the worker's Python stack, and never run a user handler.
- ``sigcont``: one epoch, then the user installs a SIGCONT handler, then prints ``epoch2`` and
  runs a second, slow epoch (24 items of 0.25 s, 2 workers), during which the test stops and
  continues the whole process group; safeloader runs with stall_timeout=2.
- ``sigcont-before``: the same, the SIGCONT handler installed before the first loader.

Prints one JSON line: what the handlers saw (``handled``: items whose Python handler ran in
the worker; ``dumps``: faulthandler dumps written to the user's file), the items,
``stall`` (a WorkerStallError's first line, or null), ``cont`` (SIGCONT handler calls).
"""

import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
import warnings

import torch  # noqa: F401  (imported before safeloader, as a user does)
from torch.utils.data import Dataset

LOADER, CASE = sys.argv[1], sys.argv[2]
PY_SIGNAL, FAULT_SIGNAL = signal.SIGRTMIN + 2, signal.SIGRTMIN + 3
dump_file = tempfile.TemporaryFile()
handled = []


def on_signal(signum, frame):
    handled.append(signum)
    if CASE == "stall":
        os.write(dump_file.fileno(), b"USER-HANDLER\n")


def install_user_handlers(worker_id=None):
    signal.signal(PY_SIGNAL, on_signal)
    faulthandler.register(FAULT_SIGNAL, file=dump_file, all_threads=False)


class Signalling(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        handled.clear()
        os.kill(os.getpid(), PY_SIGNAL)
        os.kill(os.getpid(), FAULT_SIGNAL)
        return int(PY_SIGNAL in handled)


class Hangs(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index == 5:
            time.sleep(1000)
        return index


def take_late_signal(worker_id):
    signal.signal(signal.SIGRTMAX - 1, on_signal)


class Slow(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, index):
        for _ in range(25):  # 0.25 s in steps: an item stopped midway still has work left when continued
            time.sleep(0.01)
        return index


if LOADER == "safeloader":
    from safeloader import DataLoader
    from safeloader.watchdog import WorkerStallError

    options = {"stall_timeout": 2.0}
else:
    from torch.utils.data import DataLoader

    class WorkerStallError(Exception):
        pass

    options = {}

result = {"handled": None, "dumps": None, "items": None, "stall": None, "cont": 0}
if CASE in ("workers", "init"):
    if CASE == "workers":
        install_user_handlers()
        loader = DataLoader(Signalling(), batch_size=2, num_workers=2, **options)
    else:
        loader = DataLoader(Signalling(), batch_size=2, num_workers=2, worker_init_fn=install_user_handlers, **options)
    result["handled"] = sum(int(x) for batch in loader for x in batch)
    dump_file.seek(0)
    result["dumps"] = dump_file.read().decode().count("Stack (most recent call first)")
elif CASE == "stall":
    install_user_handlers()
    items = []
    try:
        for batch in DataLoader(Hangs(), batch_size=1, num_workers=2, worker_init_fn=take_late_signal, **options):
            items += [int(x) for x in batch]
    except WorkerStallError as error:
        result["stall"] = str(error)
    result["items"] = items
    dump_file.seek(0)
    result["dumps"] = dump_file.read().decode().count("USER-HANDLER")
elif CASE == "parent":
    import polars as pl

    faulthandler.register(PY_SIGNAL, file=dump_file, all_threads=False)
    faulthandler.register(FAULT_SIGNAL, file=dump_file, all_threads=False)
    pl.DataFrame({"a": list(range(100_000))}).select(pl.col("a").sum())  # polars' pool is live
    if LOADER == "safeloader":
        options["disable_hooks"] = {"polars"}
        options["on_unsafe_fork"] = "warn"  # forked anyway: the workers never use polars
    warnings.simplefilter("ignore")
    for _ in range(2):
        loader = DataLoader(Slow(), batch_size=4, num_workers=2, **options)
        result["items"] = [int(x) for batch in loader for x in batch]
    os.kill(os.getpid(), PY_SIGNAL)  # the default action would end the process
    os.kill(os.getpid(), FAULT_SIGNAL)
    dump_file.seek(0)
    result["dumps"] = dump_file.read().decode().count("Stack (most recent call first)")
elif CASE in ("sigcont", "sigcont-before"):
    conts = []
    if CASE == "sigcont-before":
        signal.signal(signal.SIGCONT, lambda signum, frame: conts.append(signum))
    loader = DataLoader(Slow(), batch_size=2, num_workers=2, **options)
    result["items"] = [int(x) for batch in loader for x in batch]
    if CASE == "sigcont":
        signal.signal(signal.SIGCONT, lambda signum, frame: conts.append(signum))
    print("epoch2", flush=True)
    items = []
    try:
        for batch in loader:
            items += [int(x) for x in batch]
    except WorkerStallError as error:
        result["stall"] = str(error).splitlines()[0]
    result["items"] = items
    result["cont"] = len(conts)
print(json.dumps(result), flush=True)
