"""The stall watchdog never stops a healthy run that torch completes: a job stopped
with Ctrl-Z/SIGSTOP for longer than stall_timeout, a batched ``__getitems__``, a slow
``collate_fn``. A real hang in collation is still reported, named as collation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from .subproc import check_python, run_python

pytestmark = pytest.mark.timeout(240)

SLOW_ITEMS = """
import sys, time, torch
from torch.utils.data import Dataset
import safeloader
LOADER = {loader!r}

class Slow(Dataset):
    def __len__(self):
        return 64  # 8 s with 2 workers: the stop at 3 s lands mid-epoch
    def __getitem__(self, i):
        time.sleep(0.25)
        return i

if LOADER == "torch":
    from torch.utils.data import DataLoader
    kwargs = {{}}
else:
    from safeloader import DataLoader
    kwargs = {{"stall_timeout": 1.0}}
print("started", flush=True)
out = [int(x) for batch in DataLoader(Slow(), batch_size=2, num_workers=2, **kwargs) for x in batch]
assert out == list(range(64)), out
print("complete", flush=True)
"""


def _stopped_for(loader: str, seconds: float) -> tuple[int | None, str]:
    """Run SLOW_ITEMS, stop its whole process group (as Ctrl-Z does) for ``seconds`` mid-epoch, continue it."""
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(SLOW_ITEMS.format(loader=loader))],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                out.seek(0)
                if "started" in out.read():
                    break
                time.sleep(0.05)
            time.sleep(3.0)  # torch imported, workers busy mid-epoch
            os.killpg(child.pid, signal.SIGSTOP)
            time.sleep(seconds)
            os.killpg(child.pid, signal.SIGCONT)
            try:
                code: int | None = child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = None
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
        out.seek(0)
        return code, out.read()


@pytest.mark.parametrize("loader", ["torch", "safeloader", "safeloader-again", "safeloader-third"])
def test_a_stopped_job_longer_than_stall_timeout_completes(loader):
    # stall_timeout=1 s (first item 2 s); the job is stopped for 5 s while workers are busy.
    code, output = _stopped_for(loader.split("-")[0], 5.0)
    assert code == 0 and "complete" in output, output


GETITEMS = """
import time, torch
from torch.utils.data import Dataset
from safeloader import DataLoader

class Batched(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.1)
        return i
    def __getitems__(self, indices):
        return [self[i] for i in indices]  # 32 items of 0.1 s each: 3.2 s per call

out = [int(x) for b in DataLoader(Batched(), batch_size=32, num_workers=2, stall_timeout=1.0) for x in b]
assert out == list(range(64)), out
print("complete")
"""


def test_getitems_batch_gets_the_budget_of_each_item():
    result = check_python(GETITEMS, timeout=120)
    assert "complete" in result.stdout


COLLATE = """
import time, torch
from torch.utils.data import Dataset, default_collate
import safeloader
from safeloader import DataLoader
HANG = {hang!r}

def slow_collate(batch):
    time.sleep(3600 if HANG else 3.0)
    return default_collate(batch)

loader = DataLoader(list(range(16)), batch_size=4, num_workers=2, collate_fn=slow_collate, stall_timeout=2.0)
try:
    out = [int(x) for b in loader for x in b]
except safeloader.WorkerStallError as error:
    print("STALL", str(error).splitlines()[1])
else:
    assert out == list(range(16)), out
    print("complete")
"""


def test_a_slow_collate_fn_completes():
    # 3 s per batch of 4 with stall_timeout=2: collation is budgeted per item collated.
    result = check_python(COLLATE.format(hang=False), timeout=120)
    assert "complete" in result.stdout, result


def test_a_hung_collate_fn_is_reported_as_collation():
    result = run_python(COLLATE.format(hang=True), timeout=120)
    assert not result.timed_out, result
    assert "STALL" in result.stdout and "while collating a batch of 4 item(s)" in result.stdout, result
