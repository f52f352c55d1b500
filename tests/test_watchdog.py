"""The stall watchdog: a worker that deadlocks makes the loader raise, naming it; slow progress is left alone.

Each hang runs in a child interpreter under a deadline (tests/subproc.py), and
the same Dataset under torch's own DataLoader is shown to hang there.
"""

from __future__ import annotations

import gc
import json
import threading
import time

import pytest
import torch

import safeloader
from safeloader.watchdog import WorkerStallError
from safeloader.watchdog._receiving import THREAD_NAME as RECEIVE_WATCH_THREAD

from .subproc import run_script

STALL = 2.0  # seconds; the worker's first item gets 2x
TORCH_DEADLINE = 30.0  # torch's loader would wait forever: the hang is confirmed well before this

# The scenarios (a lock held by a parent thread at the fork; a worker deadlocked holding its GIL
# after sending an item; a real zarrs hang) and the runs
# under either loader are the child script tests/children/watchdog_scenario.py.
LOCK_SCENARIO = "lock"
GIL_SCENARIO = "gil"
ZARRS_SCENARIO = "zarrs"


def _safeloader_run(scenario: str, env: dict[str, str] | None = None, **extra: object) -> tuple[float, str, str]:
    result = run_script("watchdog_scenario.py", scenario, "safeloader", STALL, json.dumps(extra), timeout=90, env=env)
    assert not result.timed_out and result.returncode == 0, f"safeloader's run did not end cleanly:\n{result}"
    out = result.stdout
    assert "NO ERROR" not in out, f"the deadlock must raise WorkerStallError:\n{result}"
    elapsed = float(out.split("ELAPSED", 1)[1].split()[0])
    message = out.split("MESSAGE-BEGIN\n", 1)[1].split("MESSAGE-END", 1)[0]
    leftover = out.split("LEFTOVER", 1)[1].strip()
    return elapsed, message, leftover


def _assert_torch_hangs(scenario: str) -> None:
    result = run_script("watchdog_scenario.py", scenario, "torch", timeout=TORCH_DEADLINE, expect_hang=True)
    assert result.timed_out and "TORCH DONE" not in result.stdout, (
        f"torch's DataLoader was expected to hang on this Dataset:\n{result}"
    )


@pytest.mark.timeout(120)
def test_lock_held_by_parent_thread_at_fork_raises_naming_the_frame_and_cause():
    _assert_torch_hangs(LOCK_SCENARIO)
    elapsed, message, leftover = _safeloader_run(LOCK_SCENARIO)
    # The stuck item is a worker's second: limit STALL, plus stack collection.
    assert STALL <= elapsed < STALL + 30, elapsed
    assert "DataLoader worker" in message and "__getitem__" in message, message
    assert "lock" in message.split("Likely cause:", 1)[1] and "lock-holder" in message, message
    if safeloader.NATIVE:  # the extension's stack dumper (a run without it: SAFELOADER_REQUIRE_NATIVE=0)
        assert "Native stack of the main thread" in message and "libpython" in message, message
    assert leftover == "[]", f"workers left running: {leftover}"


@pytest.mark.torch_baseline
@pytest.mark.timeout(60)
def test_torchs_loader_hangs_reading_a_batch_from_a_worker_deadlocked_holding_its_gil():
    _assert_torch_hangs(GIL_SCENARIO)


@pytest.mark.timeout(120)
def test_a_worker_deadlocked_holding_its_gil_is_named_while_the_main_thread_reads_its_last_batch():
    """The main thread reads item 2 after worker 0 deadlocked in item 4 holding its GIL: fetching the
    item's tensor from that worker blocks inside torch's receive, where no check between two waits
    runs; the iterator's ReceiveWatcher thread checks meanwhile, reports, and kills the worker."""
    elapsed, message, leftover = _safeloader_run(GIL_SCENARIO)
    assert STALL <= elapsed < STALL + 30, elapsed
    assert "DataLoader worker 0 " in message and "(after 2 done)" in message, message
    assert "in __getitem__" in message and "pthread_mutex_lock" in message, message  # the Python line
    assert leftover == "[]", f"workers left running: {leftover}"


@pytest.mark.timeout(120)
def test_real_zarrs_hang_with_the_zarrs_backend_disabled_is_named():
    _assert_torch_hangs(ZARRS_SCENARIO)
    # Forked anyway (on_unsafe_fork "auto" would not fork from a live zarrs pool with its backend off).
    elapsed, message, leftover = _safeloader_run(ZARRS_SCENARIO, disable_hooks=["zarrs"], on_unsafe_fork="warn")
    # The first item of each worker hangs: limit 2 * STALL.
    assert 2 * STALL <= elapsed < 2 * STALL + 30, elapsed
    assert "__getitem__" in message, message
    cause = message.split("Likely cause:", 1)[1]
    if safeloader.NATIVE:  # its native frames, in zarrs' Rust library, name the pool
        assert cause.startswith(" zarrs' rayon pool: the worker waits for rayon's") and "disable_hooks" in cause
        assert "zarrs/_internal" in message, message
    else:  # its innermost stack shows only Python's waits: the parent's threads it lacks are named
        assert cause.startswith(" a lock that is never released") and "zarr_io" in cause, message
    assert leftover == "[]", f"workers left running: {leftover}"


@pytest.mark.timeout(120)
def test_without_the_extension_the_python_stacks_are_still_given():
    _, message, leftover = _safeloader_run(LOCK_SCENARIO, env={"SAFELOADER_DISABLE_NATIVE": "1"})
    assert "__getitem__" in message and "Likely cause: a lock" in message, message
    assert "Native stacks unavailable" in message, message
    assert leftover == "[]"


class SlowDataset(torch.utils.data.Dataset):
    """Each item takes 0.35 s: a batch of 8 takes longer than the stall limit, every item progresses."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> int:
        time.sleep(0.35)
        return index


class SlowStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for index in range(info.id, 16, info.num_workers):
            time.sleep(0.35)
            yield index


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dataset", [SlowDataset(), SlowStream()], ids=["map", "iterable"])
def test_slow_but_progressing_items_and_idle_workers_are_not_stopped(dataset):
    loader = safeloader.DataLoader(dataset, batch_size=8, num_workers=2, stall_timeout=1.0)
    got = []
    for batch in loader:
        got += batch.tolist()
        time.sleep(1.5)  # the training step outlasts stall_timeout: idle workers are not stalled
    expected = list(range(len(got)))
    assert sorted(got) == expected and len(got) == 16


@pytest.mark.timeout(60)
def test_stall_error_in_process_is_raised_and_workers_are_gone():
    # In the test process itself, so the autouse fixture checks for orphans.
    lock = threading.Lock()

    class Stuck(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> int:
            with lock:
                return index

    lock.acquire()
    try:
        loader = safeloader.DataLoader(Stuck(), num_workers=2, stall_timeout=1.0)
        with pytest.raises(WorkerStallError) as caught:
            next(iter(loader))
    finally:
        lock.release()
    assert caught.value.worker_id in (0, 1)
    assert caught.value.reports and "__getitem__" in str(caught.value)
    assert "Python stacks of all threads" in caught.value.details


def _receive_watchers() -> int:
    return sum(thread.name == RECEIVE_WATCH_THREAD for thread in threading.enumerate())


@pytest.mark.timeout(60)
def test_each_iterator_has_one_receive_watcher_which_ends_when_its_workers_are_shut_down():
    """Short epochs leave no watcher thread behind (each lived up to a poll interval after its epoch:
    37 at once over 100 epochs of 30 ms)."""
    loader = safeloader.DataLoader(list(range(8)), batch_size=2, num_workers=2, stall_timeout=600)
    for _ in range(3):
        iterator = iter(loader)
        assert next(iterator).tolist() == [0, 1]
        assert _receive_watchers() == 1
        assert [batch.tolist() for batch in iterator] == [[2, 3], [4, 5], [6, 7]]  # the end shuts it down
        assert _receive_watchers() == 0
    iterator = iter(loader)
    next(iterator)
    del iterator  # torch's __del__ shuts the workers down
    assert _receive_watchers() == 0
    persistent = safeloader.DataLoader(list(range(8)), batch_size=2, num_workers=2, persistent_workers=True)
    for _ in range(2):
        assert [batch.tolist() for batch in persistent] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert _receive_watchers() == 1  # its workers, and their watcher, serve the next epoch
    del persistent
    gc.collect()
    assert _receive_watchers() == 0


def test_stall_timeout_none_turns_the_watchdog_off():
    loader = safeloader.DataLoader(SlowDataset(), batch_size=4, num_workers=1, stall_timeout=None)
    iterator = iter(loader)
    assert not hasattr(iterator, "_safeloader_watch")
    assert next(iterator).tolist() == [0, 1, 2, 3]
    del iterator


@pytest.mark.timeout(60)
def test_a_hang_while_the_worker_starts_is_named_too():
    lock = threading.Lock()

    def init(worker_id: int) -> None:
        with lock:  # held by the test: the worker never finishes starting
            pass

    lock.acquire()
    try:
        loader = safeloader.DataLoader(SlowDataset(), num_workers=1, worker_init_fn=init, stall_timeout=1.0)
        with pytest.raises(WorkerStallError) as caught:
            next(iter(loader))
    finally:
        lock.release()
    message = str(caught.value)
    assert "while starting (fork hooks, worker_init_fn)" in message and "in init" in message, message


class SleepsForever(torch.utils.data.Dataset):
    """Items 0 and 1 come back; item 2 never does (a stand-in for a hang that no fork caused)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> int:
        if index >= 2:
            time.sleep(3600)
        return index


@pytest.mark.timeout(90)
def test_spawned_workers_are_watched_too():
    # The heartbeats travel to the worker inside safeloader's pickled worker_init_fn.
    loader = safeloader.DataLoader(SleepsForever(), num_workers=1, stall_timeout=1.0, multiprocessing_context="spawn")
    got = []
    with pytest.raises(WorkerStallError) as caught:
        for batch in loader:
            got += batch.tolist()
    assert got == [0, 1]
    assert "__getitem__" in str(caught.value) and "after 2 done" in str(caught.value), str(caught.value)
