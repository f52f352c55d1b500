"""Which of a loader start's worker forks took the registry's Python path, and what the workers got.

argv: the mode, then the number of starts.
- ``plain``: nothing changes between forks.
- ``thread``: a thread starts in the parent after the start's second fork.
- ``file``: a file is opened read-only in the parent after the start's second fork.
- ``hook``: a hook of the user's own runs at every fork (``safeloader.register_at_fork``).
- ``backend``: a backend of the user's own (``user_fast_backend``) that declares what the C path does for it.
Prints one JSON line: per start, the forks (0-based) whose ``before`` ran the registry's Python path,
what the parent was like after each fork (gc enabled, pin-memory gate closed, the watchdog's clock for
that worker set at the fork, safeloader's Python functions its callbacks called), after the start,
and the items each worker returned (with whether gc was paused when the worker began: at its fork).
"""

import gc
import json
import os
import sys
import tempfile
import threading
import time

import torch

gc_at_fork = {"enabled": None}  # in a worker: gc's state when its first at-fork callback ran


def first_in_worker() -> None:  # registered before safeloader's: runs first in each worker
    gc_at_fork["enabled"] = gc.isenabled()


os.register_at_fork(after_in_child=first_in_worker)

import safeloader  # noqa: E402  (after first_in_worker's registration)
from safeloader import _context, _dispatch, watchdog  # noqa: E402
from safeloader.backends import pin_memory  # noqa: E402

mode, starts = sys.argv[1], int(sys.argv[2])
WORKERS = 4
python_path: list[int] = []
fork = {"index": 0, "before": 0.0}
between: list[dict] = []
held: list = []
stop = threading.Event()

_recognise = _dispatch._context_for_this_fork


def recognise():  # runs only on the registry's Python path
    python_path.append(fork["index"])
    return _recognise()


_dispatch._context_for_this_fork = recognise


def _profile(frame, event, arg):
    if event == "call" and "/safeloader/" in frame.f_code.co_filename:
        fork["ran"].add(frame.f_code.co_name)


def before() -> None:  # registered after safeloader's: runs before its `before`
    fork["before"] = time.monotonic()
    fork["ran"] = set()
    sys.setprofile(_profile)


def after_in_parent() -> None:  # and after its after_in_parent
    sys.setprofile(None)
    arming = _context.armed()
    slots = arming.watch.slots if arming is not None and arming.watch is not None else None
    clock = slots[fork["index"] * watchdog.FIELDS + watchdog.LAST] if slots is not None else 0.0
    between.append({
        "gc_enabled": gc.isenabled(),
        "gate_closed": bool(pin_memory.BACKEND.gate.closers),
        "clock_set_at_fork": clock >= fork["before"],
        "ran": sorted(fork["ran"]),  # safeloader's Python functions called in the fork's parent callbacks
    })
    fork["index"] += 1
    if fork["index"] == 2 and mode == "thread":
        threading.Thread(target=stop.wait, daemon=True).start()
    if fork["index"] == 2 and mode == "file":
        with tempfile.NamedTemporaryFile(delete=False) as f:
            f.write(b"x")
        held.append(open(f.name, "rb"))
        os.unlink(f.name)


os.register_at_fork(before=before, after_in_parent=after_in_parent)
if mode == "hook":
    safeloader.register_at_fork(before=lambda: None, name="users_own_hook")
if mode == "backend":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import user_fast_backend

    safeloader.register_backend(user_fast_backend.StampBackend)


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int):
        context = safeloader.fork_context()
        info = torch.utils.data.get_worker_info()
        return {
            "index": index,
            "worker": info.id,
            "context_worker": context.worker_id if context is not None else None,
            "context_workers": context.num_workers if context is not None else None,
            "gc_enabled": gc.isenabled(),
            "gc_paused_at_fork": gc_at_fork["enabled"] is False,
            "gc_frozen": gc.get_freeze_count() > 0,
            "user_backend": sys.modules["user_fast_backend"].RECEIVED if mode == "backend" else None,
        }


report = []
for _ in range(starts):
    python_path.clear()
    between.clear()
    fork["index"] = 0
    stop = threading.Event()
    items = list(safeloader.DataLoader(Items(), batch_size=None, num_workers=WORKERS))
    report.append({
        "python_path": list(python_path),
        "between": list(between),
        "after_start": {"gc_enabled": gc.isenabled(), "gate_closed": bool(pin_memory.BACKEND.gate.closers)},
        "items": items,
    })
    stop.set()
print(json.dumps(report))
