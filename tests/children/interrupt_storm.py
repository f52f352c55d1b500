"""Interrupts at random moments of hundreds of loader starts (``iter(loader)``), then normal epochs.

argv: loader ("torch" or "safeloader"), mode, starts, seed. At each start a timer
(``signal.setitimer``) fires SIGALRM once at a random moment of it (uniform over the time an
uninterrupted start takes here), and half the time once more soon after (an interrupt landing
in the clean-up of the first). Its handler, by mode:

- ``sigint``: sends SIGINT to this process (Ctrl-C; Python's own handler raises KeyboardInterrupt);
- ``group``: sends SIGINT to the whole process group (Ctrl-C in a terminal: the workers get it too);
- ``alarm``: raises ``Alarm``, an ``Exception`` a signal handler raises.

Only while a start is under way (``window``), so that this script's own bookkeeping is never
interrupted. torch's DataLoader runs without safeloader imported at all. Then the worker
processes left behind are counted, and one epoch runs in the main thread and one in another
thread. Prints one JSON line: ``outcomes`` (what ``iter(loader)`` raised, by type, or
"started"), ``interrupted`` (starts the handler interrupted), ``lost`` (of those, starts that
ended without an exception: the interrupt was dropped), ``swallowed`` (interrupts CPython
reported to ``sys.unraisablehook`` instead, by where), ``leftover`` (worker processes alive),
``main_epoch``/``thread_epoch`` (batches, or "hung").
"""

import collections
import faulthandler
import gc
import json
import os
import random
import signal
import statistics
import sys
import threading
import time

import psutil

kind, mode, starts, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "torch":
    from torch.utils.data import DataLoader as Loader
else:
    from safeloader import DataLoader as Loader


class Alarm(Exception):
    """What the SIGALRM handler raises in ``alarm`` mode."""


parent = os.getpid()
rng = random.Random(seed)
window = False  # a start is under way: the handler interrupts it
raised = 0  # interrupts raised during this start
span = 0.05  # seconds: how long an uninterrupted start takes (measured below)


def on_alarm(signum, frame):
    global raised
    if not window or os.getpid() != parent:
        return
    if rng.random() < 0.5:
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0001, span / 4))
    raised += 1
    if mode == "alarm":
        raise Alarm()
    if mode == "group":
        os.killpg(0, signal.SIGINT)
    else:
        os.kill(parent, signal.SIGINT)


swallowed = collections.Counter()
previous_hook = sys.unraisablehook


def on_unraisable(unraisable):
    if isinstance(unraisable.exc_value, (KeyboardInterrupt, Alarm)) and os.getpid() == parent:
        callback = unraisable.object
        swallowed[f"{getattr(callback, '__module__', '?')}.{getattr(callback, '__qualname__', callback)}"] += 1
        return
    previous_hook(unraisable)


sys.unraisablehook = on_unraisable
signal.signal(signal.SIGALRM, on_alarm)
loader = Loader(list(range(8)), batch_size=2, num_workers=2)

durations = []
for _ in range(6):
    began = time.monotonic()
    iterator = iter(loader)
    durations.append(time.monotonic() - began)
    del iterator
span = statistics.median(durations[2:])  # after the first starts' warm-up

faulthandler.dump_traceback_later(100, exit=True)  # a hung storm shows where it waits (deadline: 120 s)
outcomes = collections.Counter()
interrupted = lost = 0
other = ""
began = time.monotonic()
for _ in range(starts):
    iterator = None
    outcome = "started"
    raised = 0
    try:
        window = True
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0001, span))
        iterator = iter(loader)
        window = False
    except BaseException as error:  # counted by type
        window = False
        outcome = type(error).__name__
        if not isinstance(error, (KeyboardInterrupt, Alarm)) and not other:
            other = f"{type(error).__name__}: {error}"[:500]
    signal.setitimer(signal.ITIMER_REAL, 0)
    outcomes[outcome] += 1
    interrupted += raised > 0
    lost += raised > 0 and outcome == "started"
    del iterator
storm_seconds = time.monotonic() - began
signal.signal(signal.SIGALRM, signal.SIG_IGN)


def leftover_workers():
    found = 0
    for process in psutil.Process().children():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(process.cmdline()):
                found += 1
        except psutil.NoSuchProcess:
            pass
    return found


gc.collect()
deadline = time.monotonic() + 2
while leftover_workers() and time.monotonic() < deadline:
    time.sleep(0.05)
leftover = leftover_workers()
print("storm done", flush=True)

faulthandler.dump_traceback_later(20, exit=True)  # a hung epoch shows where it waits
main_epoch = len(list(loader))
print("main-thread epoch done", flush=True)
thread_epoch = []
thread = threading.Thread(target=lambda: thread_epoch.append(len(list(loader))), daemon=True)
thread.start()
thread.join(10 if kind == "safeloader" else 3)  # torch's hangs after such a storm: logging's lock
if not thread_epoch:
    faulthandler.dump_traceback(all_threads=True)
result = {
    "loader": kind,
    "mode": mode,
    "starts": starts,
    "start_ms": round(span * 1000, 1),
    "storm_seconds": round(storm_seconds, 2),
    "outcomes": dict(outcomes),
    "other": other,
    "interrupted": interrupted,
    "lost": lost,
    "swallowed": dict(swallowed),
    "leftover": leftover,
    "main_epoch": main_epoch,
    "thread_epoch": thread_epoch[0] if thread_epoch else "hung",
}
print(json.dumps(result), flush=True)
os._exit(0)
