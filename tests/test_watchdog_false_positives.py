"""The stall watchdog never stops a healthy run that torch completes: a job stopped
with Ctrl-Z/SIGSTOP for longer than stall_timeout, a batched ``__getitems__``, a slow
``collate_fn``. A real hang in collation is still reported, named as collation."""

from __future__ import annotations

import json

import pytest

from .subproc import check_script, run_script, run_stopped

pytestmark = pytest.mark.timeout(240)


def _stopped_for(loader: str, seconds: float, *args: str, delay: float = 3.0) -> tuple[int | None, str]:
    """Run children/slow_items.py, stop its whole process group (as Ctrl-Z does) for ``seconds``
    mid-epoch (``delay`` seconds after it started its loader: workers busy), continue it."""
    return run_stopped("slow_items.py", loader, *args, marker="started", delay=delay, seconds=seconds)


@pytest.mark.parametrize("loader", ["torch", "safeloader", "safeloader-again", "safeloader-third"])
def test_a_stopped_job_longer_than_stall_timeout_completes(loader):
    # stall_timeout=1 s (first item 2 s); the job is stopped for 5 s while workers are busy.
    code, output = _stopped_for(loader.split("-")[0], 5.0)
    assert code == 0 and "complete" in output, output


def test_a_stopped_job_with_forkserver_workers_completes():
    """A forkserver's workers are not this process's children: the kernel cannot say they were
    continued, and their clocks start again only from this process's own overslept waits, the
    receive watcher's among them (which once checked first after the stop: a false stall)."""
    code, output = _stopped_for("safeloader", 5.0, "forkserver", delay=5.0)  # the forkserver starts first
    assert code == 0 and "complete" in output, output


def test_getitems_batch_gets_the_budget_of_each_item():
    result = check_script("batched_getitems.py", timeout=120)
    assert "complete" in result.stdout


def test_a_slow_collate_fn_completes():
    # 3 s per batch of 4 with stall_timeout=2: collation is budgeted per item collated.
    result = check_script("slow_collate.py", "slow", timeout=120)
    assert "complete" in result.stdout, result


def test_a_hung_collate_fn_is_reported_as_collation():
    result = run_script("slow_collate.py", "hang", timeout=120)
    assert not result.timed_out, result
    assert "STALL" in result.stdout and "while collating a batch of 4 item(s)" in result.stdout, result


@pytest.mark.parametrize("when", ["busy", "idle"])
def test_a_worker_stopped_alone_is_named_while_it_is_stopped_and_the_epoch_completes(when):
    """torch's loader waits for a stopped worker without a word; safeloader's says which worker, why
    the loader waits and how to resume it, once, and is not mistaken for a stall. ``busy``: stopped
    at once, most often within a batch; ``idle``: stopped once it has sent every batch it was given,
    so that the main thread, reading one of them, waits for the worker inside torch's receive."""
    args = ("idle",) if when == "idle" else ()
    if when == "idle":
        torch_run = json.loads(check_script("stopped_worker.py", "torch", *args, timeout=90).stdout)
        assert torch_run["items"] and torch_run["while_stopped"] == [], torch_run  # silent while it waited

    run = json.loads(check_script("stopped_worker.py", "safeloader", *args, timeout=90).stdout)
    assert run["items"], run  # every item, once: nothing lost, no stall raised
    (warning,) = run["while_stopped"]
    assert warning.startswith("WorkerStoppedWarning: safeloader: DataLoader worker 0 "), warning
    assert f"(pid {run['pid']})" in warning and f"kill -CONT {run['pid']}" in warning, warning
    assert run["after"] == [], run  # once per stop
