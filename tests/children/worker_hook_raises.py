"""A worker's ``after_in_child`` hook (or, under torch's loader, its ``worker_init_fn``) raises.

argv: what it raises (``KeyboardInterrupt``, ``SystemExit``, ``RuntimeError``, or ``SIGINT``:
the worker sends itself SIGINT, as Ctrl-C to the process group does, and waits for it), and
``safeloader`` (a fork hook named 'raising') or ``torch`` (torch's loader, the same raise in its
``worker_init_fn``: the nearest torch has). Prints ``<ExceptionType>: <line>`` of what the
parent's loop raised: the line naming the hook if there is one, else the first.
"""

import os
import signal
import sys
import time

from torch.utils.data import DataLoader as TorchDataLoader

import safeloader

what, which = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as a script started from a shell has


def raising(*_worker_id):
    if what == "SIGINT":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)  # the handler raises KeyboardInterrupt here
        raise AssertionError("SIGINT did not interrupt the worker")
    raise {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit, "RuntimeError": RuntimeError}[what](3)


if which == "safeloader":
    safeloader.register_at_fork(after_in_child=raising, name="raising")
    loader = safeloader.DataLoader(list(range(4)), num_workers=1)
else:
    loader = TorchDataLoader(list(range(4)), num_workers=1, worker_init_fn=raising)
try:
    list(loader)
except BaseException as error:  # whatever reaches the user is the result
    lines = str(error).splitlines() or [""]
    print(f"{type(error).__name__}:", next((line for line in lines if "fork hook" in line), lines[0]))
else:
    print("no error")
