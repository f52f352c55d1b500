"""Interrupts at random moments of loader starts, hundreds of times; every start after one must work.

Run by tests/test_interrupts.py (60 starts), and by hand for longer storms
(``PYTHONPATH=. python tests/children/interrupt_storm.py safeloader 300 sigint``).

argv: ``torch`` or ``safeloader`` (whose DataLoader), the number of starts, and ``alarm`` (a
SIGALRM handler that raises, as a user's timeout would), ``sigint`` (Ctrl-C: SIGINT to the
process, KeyboardInterrupt), ``pgroup`` (Ctrl-C as a terminal sends it: SIGINT to the whole
process group, the workers included; the child must lead its own group) or ``external`` (the
same, sent by another process at a random moment, wherever the parent's threads are then: in a
fork, in C code, waiting on a lock). Each start gets a timer of 0-60 ms, which fires anywhere in
``iter(loader)`` and the first batch, or never (``external``: always, the first batch waits).
Every 10th start runs a whole epoch from another thread. ``STORM_HELD_FILES`` (environment): the
Dataset holds that many open files too (64 or more: the files hook's lock reader thread runs in
each start). Prints ``start <n>`` before each
start (the last one printed is where a hang sits), then
``done <starts> interrupted <count> workers-left <count>``: worker processes still alive 5 s
after the last start, all iterators dropped. torch's own loader hangs within the first 10
starts: an interrupt that lands in an at-fork callback (logging's ``_releaseLock``) leaves
logging's lock held, and the next fork, from the epoch's thread, waits for it forever.
safeloader defers a signal handler's exception that lands in its own code (and Ctrl-C anywhere
in the start) to the end of the start (_deferred_signals).
A start still running after ``STORM_DUMP_SECONDS`` (environment, default 60) dumps every thread's
stack to stderr and exits (faulthandler): where a hang sits.
"""

import faulthandler
import gc
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tests.children.workers_left import workers_left

LOADER, STARTS, KIND = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if LOADER == "torch":
    from torch.utils.data import DataLoader
else:
    from safeloader import DataLoader


class Alarm(Exception):
    pass


armed = False


def on_alarm(signum, frame):
    global armed
    if armed:  # once per start
        armed = False
        if KIND == "alarm":
            raise Alarm
        if KIND == "pgroup":
            os.kill(0, signal.SIGINT)  # the whole group: the workers forked so far too
            return
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: Python's own handler raises KeyboardInterrupt


signal.signal(signal.SIGALRM, on_alarm)
interrupts = (Alarm,) if KIND == "alarm" else (KeyboardInterrupt,)


def interrupted_by_the_storm(error: BaseException) -> bool:
    # Ctrl-C to the group also ends a worker forked but not yet in torch's worker loop (which
    # ignores it): torch's SIGCHLD handler then raises that a worker exited, as under torch's loader.
    return KIND in ("pgroup", "external") and isinstance(error, RuntimeError) and "exited unexpectedly" in str(error)


# ``external``: for each start the sender is given the start's number and a delay, then sends SIGINT
# to the group (itself ignoring it) and writes the number to a file. The start's try-block waits
# until the number is there, so the signal lands in it. A file, not an answer on a pipe: an answer
# read just before the KeyboardInterrupt is raised would be lost, and waited for again forever.
SENDER = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
sent = os.open(sys.argv[1], os.O_WRONLY)
for line in sys.stdin:
    start, delay = line.split()
    time.sleep(float(delay))
    os.killpg(os.getpgrp(), signal.SIGINT)
    os.pwrite(sent, start.encode().ljust(16), 0)
"""
sender = sent_file = None
if KIND == "external":
    sent_file = tempfile.NamedTemporaryFile(prefix="storm-sent-")
    sender = subprocess.Popen([sys.executable, "-c", SENDER, sent_file.name], stdin=subprocess.PIPE, text=True)


def wait_until_sent(start: int) -> None:
    while os.pread(sent_file.fileno(), 16, 0).strip() != str(start).encode():
        time.sleep(0.001)


dump_after = float(os.environ.get("STORM_DUMP_SECONDS", "60"))


class Items:
    """16 items; with ``STORM_HELD_FILES`` (environment) that many open files held besides, whose
    identities and locks the parent reads on a thread of its own while it forks (64 or more)."""

    def __init__(self, held: int) -> None:
        self.directory = tempfile.TemporaryDirectory(prefix="storm-files-")
        self.files = []
        for i in range(held):
            path = os.path.join(self.directory.name, str(i))
            with open(path, "wb") as f:
                f.write(b"x")
            self.files.append(open(path, "rb"))

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> int:
        return index


loader = DataLoader(Items(int(os.environ.get("STORM_HELD_FILES", "0"))), batch_size=2, num_workers=2)
random.seed(7)
interrupted = 0
for start in range(STARTS):
    print("start", start, flush=True)
    faulthandler.dump_traceback_later(dump_after, exit=True)
    if start % 10 == 9:
        batches: list = []
        thread = threading.Thread(target=batches.extend, args=(loader,))
        thread.start()
        thread.join()
        assert len(batches) == 8, batches
        continue
    try:
        armed = True
        if sender is not None:
            sender.stdin.write(f"{start} {random.uniform(0.0, 0.06)}\n")
            sender.stdin.flush()
        else:
            signal.setitimer(signal.ITIMER_REAL, random.uniform(0.0, 0.06))
        iterator = iter(loader)
        next(iterator)
        if sender is not None:
            wait_until_sent(start)
            time.sleep(0.01)  # the signal reaches a thread as it was sent: its handler runs by now
        armed = False
    except interrupts:
        interrupted += 1
    except RuntimeError as error:
        if not interrupted_by_the_storm(error):
            raise
        interrupted += 1
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
    iterator = None
    if sender is not None:
        wait_until_sent(start)  # the start was cut short by this start's signal: nothing more comes
    gc.collect()
faulthandler.cancel_dump_traceback_later()
if sender is not None:
    sender.stdin.close()
    sender.wait()


left = workers_left()
print("done", STARTS, "interrupted", interrupted, "workers-left", len(left), flush=True)
