"""A worker's descriptor table is grown right after the fork, while the worker has one thread.

Linux grows a process's descriptor table when a new descriptor does not fit, and in a process with
several threads it first waits for an RCU grace period (10-30 ms on a 16-core machine). torch's
workers open their descriptors (shared-memory tensors, the sockets that pass them) with their
queue-feeder thread running: a parent whose descriptors end just below a power of two made every
worker's first batch wait there (docs/benchmarks.md, GPU machine). The wait itself is a time and is
measured in benchmarks/bench_fd_table.py; these tests check what causes it: whether the table
grows while the worker has more than one thread.
"""

from __future__ import annotations

import json

import pytest

from safeloader import native

from .subproc import check_python

pytestmark = pytest.mark.timeout(120)

WORKER_TABLE = """
import json, os, sys
import torch
import safeloader

def table_size():  # the slots of this process's descriptor table now
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("FDSize:")))

held = []  # each item opens 8 descriptors and keeps them, as a Dataset holding files would

class Opening(torch.utils.data.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        before = table_size()
        threads = len(os.listdir("/proc/self/task"))
        for _ in range(4):
            held.extend(os.pipe())
        return torch.tensor([before, threads, table_size()])

loader_class = torch.utils.data.DataLoader if sys.argv[1] == "torch" else safeloader.DataLoader
rows = [batch[0].tolist() for batch in loader_class(Opening(), batch_size=1, num_workers=1,
                                                      multiprocessing_context="fork")]
print(json.dumps({"parent": table_size(), "rows": rows}))
"""


def _worker_rows(kind: str) -> tuple[int, list[list[int]]]:
    out = json.loads(check_python(WORKER_TABLE.replace("sys.argv[1]", repr(kind)), timeout=90).stdout)
    return out["parent"], out["rows"]


def test_torchs_worker_grows_its_table_with_threads_running_and_safeloaders_never_does():
    _, torch_rows = _worker_rows("torch")
    grown = [(before, threads, after) for before, threads, after in torch_rows if after > before]
    assert grown, f"torch's worker never grew its table over 192 descriptors: {torch_rows}"
    assert any(threads > 1 for _, threads, _ in grown), (
        f"torch's worker must have grown its table with its feeder thread running (the wait), got {grown}"
    )

    parent, rows = _worker_rows("safeloader")
    sizes = {size for before, _, after in rows for size in (before, after)}
    assert len(sizes) == 1 and min(sizes) >= 512, (
        f"safeloader's worker must start with its table grown by 512 spare slots (the parent's: {parent}) "
        f"and never grow it, got {rows}"
    )
    assert all(threads > 1 for _, threads, _ in rows[1:]), f"the worker's threads were not running: {rows}"


RESERVE = """
import json, os, resource
from safeloader import native

def table_size():
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("FDSize:")))

os.close(0)  # the first open descriptor is then not 0: another one is duplicated
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(100)]
lowest = os.dup(1); os.close(lowest)
count = len(os.listdir("/proc/self/fd"))
first = native.reserve_descriptor_slots(300)
after_first = [table_size(), len(os.listdir("/proc/self/fd")) == count]
resource.setrlimit(resource.RLIMIT_NOFILE, (1500, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
capped = native.reserve_descriptor_slots(5000)
print(json.dumps({"native": native.NATIVE, "lowest": lowest, "first": first, "after_first": after_first,
                  "capped": capped, "after_capped": table_size(), "none": native.reserve_descriptor_slots(0)}))
"""


@pytest.mark.parametrize("fallback", [False, True], ids=["extension", "fallback"])
def test_reserve_descriptor_slots_makes_room_above_the_lowest_free_descriptor_and_keeps_under_the_limit(fallback):
    if not fallback and not native.NATIVE:
        pytest.skip("the C extension is not in use (SAFELOADER_DISABLE_NATIVE=1 or not built)")
    env = {"SAFELOADER_DISABLE_NATIVE": "1"} if fallback else {}
    result = json.loads(check_python(RESERVE, timeout=60, env=env).stdout)
    assert result["native"] is not fallback
    lowest = result["lowest"]
    assert lowest > 100, result  # the 100 descriptors held are below it
    # room for 300 more: the kernel's next power of two, and the descriptor it used closed again
    assert result["first"] == lowest + 300 and result["after_first"] == [512, True], result
    assert result["capped"] == 1500 and result["after_capped"] == 2048, result  # the soft limit, not 5000
    assert result["none"] == 0, result  # no room asked: nothing done
