"""Ctrl-C during a loader start (issue 21, item 3): a KeyboardInterrupt raised before and after
each built-in hook's parent-side code reaches the caller as itself (never a HookError), every
hook's state is rolled back, nothing is left held (the next start works, from the main thread
and from another one) and no worker is left behind. Runs in a child under a deadline.
"""

from __future__ import annotations

import json

import pytest

from tests.subproc import check_python, check_script, run_python, run_script

pytestmark = pytest.mark.timeout(240)


def test_a_keyboard_interrupt_in_each_builtin_hooks_parent_phase_reaches_the_user_and_the_next_start_works():
    result = check_script("interrupt_in_each_hook.py", timeout=150)
    lines = result.stdout.splitlines()
    assert len(lines) > 10, result  # the hooks of this environment, each phase, each place
    assert all(line.endswith(": ok") for line in lines[1:]), result


# What an interrupt can leave held in a start that was cut short (safeloader/_abandoned_locks.py,
# found with tests/children/interrupt_storm.py): each is left held here on purpose, in a child.
def test_what_an_interrupted_start_left_held_is_released_and_the_next_use_works():
    result = check_python(
        """
        import multiprocessing, threading, types
        from safeloader import _abandoned_locks, _torch_internals
        from torch.utils.data._utils import signal_handling

        # A put interrupted between its lock's acquire and its with-block.
        queue = multiprocessing.get_context("fork").Queue()
        queue._notempty._lock.acquire()
        print("queue lock abandoned:", not queue._notempty._lock.acquire(timeout=0.2))
        _abandoned_locks.release_queue_locks(types.SimpleNamespace(_index_queues=[queue]))
        queue.put(1)  # torch's shutdown puts: it waited forever
        print("put after release:", queue.get(timeout=5))

        # A Thread.start interrupted the same way.
        threading._active_limbo_lock.acquire()
        _abandoned_locks.release_threading_lock()
        worker = threading.Thread(target=lambda: None)
        done = threading.Event()
        starter = threading.Thread(target=lambda: (worker.start(), done.set()), daemon=True)
        starter.start()
        print("thread starts after release:", done.wait(5))

        # torch's worker-pid entry registered just before the interrupt.
        class Iterator:
            _worker_pids_set = False
        iterator = Iterator()
        signal_handling._set_worker_pids(id(iterator), (multiprocessing.current_process().pid,))
        _torch_internals.forget_worker_pids(iterator)
        signal_handling._set_worker_pids(id(iterator), (1,))  # the next iterator at that address
        signal_handling._remove_worker_pids(id(iterator))
        print("pid entry forgotten: True")
        """,
        timeout=60,
    )
    assert result.stdout.splitlines() == [
        "queue lock abandoned: True",
        "put after release: 1",
        "thread starts after release: True",
        "pid entry forgotten: True",
    ], result



# Ctrl-C to the process group also kills a worker not yet in torch's loop: torch's SIGCHLD handler
# then raises a RuntimeError in the parent, wherever it is, also while a start that was cut short is
# undone (issue 42's storm hung once there: the error cut the wait for an abandoned queue lock short,
# was taken for "released meanwhile", and torch's shutdown then waited for that lock forever).
_QUEUE_LOCK_LEFT_HELD = """
import gc, multiprocessing, signal, sys, types
from safeloader import _loader

queue = multiprocessing.get_context("fork").Queue()
queue.put(0); queue.get(timeout=5)  # its feeder thread runs, as in a start
queue._notempty._lock.acquire()  # a put of the start cut short: held by nobody from here on

class HalfBuiltIterator:
    _index_queues = [queue]
    def _shutdown_workers(self):  # torch's: a None into each worker's queue
        queue.put(None)

def raise_as_torchs_sigchld_handler_does(signum, frame):
    raise RuntimeError("DataLoader worker (pid(s) 1) exited unexpectedly")

signal.signal(signal.SIGALRM, raise_as_torchs_sigchld_handler_does)
signal.setitimer(signal.ITIMER_REAL, 0.1)  # lands while the abandoned lock is waited for
_loader._stop_workers_despite_interrupts(HalfBuiltIterator(), types.SimpleNamespace(launches=[]))
print("the shutdown's put went through:", queue.get(timeout=5), flush=True)

class CutInItsPut(HalfBuiltIterator):
    _index_queues = [queue]
    def _shutdown_workers(self):  # the handler's error lands inside torch's put, its lock taken
        queue._notempty._lock.acquire()
        raise_as_torchs_sigchld_handler_does(signal.SIGCHLD, sys._getframe())

_loader._stop_workers_despite_interrupts(CutInItsPut(), types.SimpleNamespace(launches=[]))
print("lock held after:", queue._notempty._lock.locked(), flush=True)
del queue, HalfBuiltIterator, CutInItsPut
gc.collect()  # the queue's finalizer takes its lock
print("collected", flush=True)
"""


def test_a_start_cut_short_is_undone_though_a_worker_death_raises_while_its_queue_locks_are_released():
    result = run_python(_QUEUE_LOCK_LEFT_HELD, timeout=30)
    assert not result.timed_out and result.returncode == 0, result
    assert result.stdout.splitlines() == [
        "the shutdown's put went through: None", "lock held after: False", "collected"], result


@pytest.mark.torch_baseline
def test_torchs_loader_hangs_in_its_shutdown_when_a_put_left_its_queue_lock_held():
    result = run_python(
        """
        import torch
        iterator = iter(torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=2))
        iterator._index_queues[0]._notempty._lock.acquire()  # a put cut short by a signal handler's error
        del iterator  # torch's __del__ shuts its workers down: a None into each worker's queue
        print("shut down", flush=True)
        """,
        timeout=20,
        expect_hang=True,
    )
    assert result.timed_out and "shut down" not in result.stdout, result



# Ctrl-C during a start waits for the start's end (safeloader/_deferred_signals.py): it can no
# longer land in torch's, multiprocessing's or threading's code and abandon a lock there.
def interrupt_during_start(loader: str, mode: str) -> dict:
    result = check_script("interrupt_during_start.py", loader, mode, timeout=60)
    return json.loads(result.stdout.splitlines()[-1])


def raised_cleanly(yielded: int, handler: str = "python") -> dict:
    """What interrupt_during_start reports when the KeyboardInterrupt reached the caller in time, no
    worker is left, SIGINT's handler is ``handler`` again and the next epoch reads every batch."""
    return {"raised": True, "yielded before": yielded, "workers left": 0, "within 10 s": True, "handler": handler,
            "next epoch": [[0, 1], [2, 3], [4, 5], [6, 7]]}


def test_ctrl_c_during_a_start_is_raised_once_the_start_is_undone_not_inside_torchs_code():
    # torch: the KeyboardInterrupt lands inside its start (in the sampler, before the first index).
    torch_run = interrupt_during_start("torch", "once")
    assert torch_run["raised"] and torch_run["yielded before"] == 0
    # safeloader: the start runs to its end (the workers got their first indices), is undone,
    # then the KeyboardInterrupt reaches the caller; no worker is left and the handler is Python's.
    assert interrupt_during_start("safeloader", "once") == raised_cleanly(8)


def test_a_second_ctrl_c_during_a_start_raises_at_once():
    assert interrupt_during_start("safeloader", "twice") == raised_cleanly(0)


def test_a_handler_the_user_installs_during_a_start_is_theirs_afterwards():
    assert interrupt_during_start("safeloader", "replace") == raised_cleanly(0, "own")


def test_in_a_start_that_does_not_end_the_interrupt_is_raised_after_the_grace():
    # The sampler blocks for 60 s after the Ctrl-C: a one-shot interrupt (a timeout) must still get
    # through a start that hangs, GRACE_SECONDS (2 s) later, not when the start ends.
    assert interrupt_during_start("safeloader", "hang") == raised_cleanly(0)


# The storm (tests/children/interrupt_storm.py): interrupts at random moments of many starts.
# "external": Ctrl-C as a terminal sends it, from another process to the whole process group (the
# workers too) at a random moment of the start (issue 42, item 8: such a storm hung once in three
# runs of 100 starts; not seen again here: 3 x 300 "pgroup" and 1 x 300 "external" starts of the
# code the issue was filed against, and several hundred a kind since, all ended).
@pytest.mark.parametrize("kind", ["sigint", "alarm", "external"])
def test_every_start_after_an_interrupt_storm_works_and_no_worker_is_left(kind):
    result = check_script("interrupt_storm.py", "safeloader", "60", kind, timeout=150)
    done = result.stdout.splitlines()[-1].split()
    assert done[:2] == ["done", "60"] and int(done[3]) > 0, result  # some starts were interrupted
    assert done[4:] == ["workers-left", "0"], result


@pytest.mark.torch_baseline
@pytest.mark.parametrize("kind", ["sigint", "alarm", "external"])
def test_torchs_loader_hangs_or_fails_in_the_same_storm(kind):
    result = run_script("interrupt_storm.py", "torch", "60", kind, timeout=40, expect_hang=True)
    # Mostly a hang; an interrupt landing early in its iterator's __init__ can instead make torch's
    # own clean-up raise (AttributeError: no `_workers_status`), which ends the script: a failure too.
    crashed = result.returncode not in (None, 0) and "Error" in result.stdout + result.stderr
    assert result.timed_out or crashed, f"torch's loader was expected to hang or fail in the storm:\n{result}"


# The done event torch makes per iterator (its workers ask is_set for every index; the parent sets it
# at shutdown), its lock left held as a Ctrl-C to the process group leaves it when it lands between
# the lock's acquire and its `with` in a worker (issue 42's storms with files held hung there).
_DONE_EVENT_LOCK_LEFT_HELD = """
import sys, time
import torch
import safeloader
loader_class = safeloader.DataLoader if sys.argv[1] == "safeloader" else torch.utils.data.DataLoader
loader = loader_class(list(range(8)), batch_size=2, num_workers=2)
iterator = iter(loader)
iterator._workers_done_event._cond.acquire()  # and never released: held by nobody from here on
print(len(list(iterator)), "batches", flush=True)
del iterator
print("ended", loader.multiprocessing_context, flush=True)
"""


def test_an_epoch_ends_though_the_workers_done_events_lock_was_left_held():
    result = run_python(_DONE_EVENT_LOCK_LEFT_HELD.replace("sys.argv[1]", "'safeloader'"), timeout=60)
    assert not result.timed_out and result.returncode == 0, result
    assert result.stdout.split("\n")[:2] == ["4 batches", "ended None"], result  # the user's context given back


@pytest.mark.torch_baseline
def test_torchs_loader_hangs_when_the_workers_done_events_lock_was_left_held():
    result = run_python(_DONE_EVENT_LOCK_LEFT_HELD.replace("sys.argv[1]", "'torch'"), timeout=20, expect_hang=True)
    assert result.timed_out and "batches" not in result.stdout, result
