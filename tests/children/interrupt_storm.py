"""Interrupts at random moments of loader starts, hundreds of times; every start after one must work.

Run by tests/test_interrupts.py (60 starts), and by hand for longer storms
(``PYTHONPATH=. python tests/children/interrupt_storm.py safeloader 300 sigint``).

argv: ``torch`` or ``safeloader`` (whose DataLoader), the number of starts, and ``alarm`` (a
SIGALRM handler that raises, as a user's timeout would) or ``sigint`` (Ctrl-C: SIGINT to the
process, KeyboardInterrupt). Each start gets a timer of 0-60 ms, which fires anywhere in
``iter(loader)`` and the first batch, or never. Every 10th start runs a whole epoch from another
thread. Prints ``start <n>`` before each start (the last one printed is where a hang sits), then
``done <starts> interrupted <count> workers-left <count>``: worker processes still alive 5 s
after the last start, all iterators dropped. torch's own loader hangs within the first 10
starts: an interrupt that lands in an at-fork callback (logging's ``_releaseLock``) leaves
logging's lock held, and the next fork, from the epoch's thread, waits for it forever.
safeloader defers a signal handler's exception to the end of the start (_deferred_signals).
"""

import gc
import random
import signal
import sys
import threading

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
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: Python's own handler raises KeyboardInterrupt


signal.signal(signal.SIGALRM, on_alarm)
interrupts = (Alarm,) if KIND == "alarm" else (KeyboardInterrupt,)

loader = DataLoader(list(range(16)), batch_size=2, num_workers=2)
random.seed(7)
interrupted = 0
for start in range(STARTS):
    print("start", start, flush=True)
    if start % 10 == 9:
        batches: list = []
        thread = threading.Thread(target=batches.extend, args=(loader,))
        thread.start()
        thread.join()
        assert len(batches) == 8, batches
        continue
    try:
        armed = True
        signal.setitimer(signal.ITIMER_REAL, random.uniform(0.0, 0.06))
        iterator = iter(loader)
        next(iterator)
        armed = False
    except interrupts:
        interrupted += 1
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
    iterator = None
    gc.collect()


left = workers_left()
print("done", STARTS, "interrupted", interrupted, "workers-left", len(left), flush=True)
