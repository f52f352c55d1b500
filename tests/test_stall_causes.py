"""Two hangs torch leaves silent: a parent thread inside glibc's dynamic loader while workers
fork (safeloader waits for it and forks healthy workers), and GNU OpenMP used with more than
one thread after the parent ran a parallel region (with safeloader's threadpools backend
disabled, the stall report names it and the disabled backend).
Each runs in a child under a deadline; torch's own loader is shown to hang on the same code."""

from __future__ import annotations

import pytest

from .subproc import run_python

pytestmark = pytest.mark.timeout(200)

# A parent thread sits inside dl_iterate_phdr (glibc's loader lock held; its
# callback sleeps) while the workers fork: a worker's dlopen waits forever.
LOADER_LOCK = """
import ctypes, os, threading, time
import torch
from torch.utils.data import Dataset
import safeloader
LOADER = {loader!r}

class LoadsALibrary(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        ctypes.CDLL("libm.so.6")
        return i

if LOADER == "torch":
    from torch.utils.data import DataLoader
    kwargs = {{}}
else:
    from safeloader import DataLoader
    kwargs = {{"stall_timeout": 2.0}}
loader = DataLoader(LoadsALibrary(), num_workers=1, **kwargs)
list(loader)  # a first epoch: whatever starting workers loads is loaded now

libc = ctypes.CDLL(None)
callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
inside = threading.Event()
def visit(info, size, data):
    inside.set()
    time.sleep(8)  # holds the loader lock meanwhile
    return 1
walker = threading.Thread(target=lambda: libc.dl_iterate_phdr(callback_type(visit), None), daemon=True)
walker.start()
inside.wait()
try:
    print(list(loader))
except safeloader.WorkerStallError as error:
    print("STALL", str(error))
os._exit(0)  # the walker thread still sleeps inside the loader
"""


@pytest.mark.torch_baseline
def test_torch_hangs_when_a_parent_thread_holds_the_loader_lock_at_fork():
    assert run_python(LOADER_LOCK.format(loader="torch"), timeout=15).timed_out


def test_safeloader_forks_after_a_parent_thread_releases_the_loader_lock():
    # safeloader's worker start itself needs the loader lock (its fork-time snapshot walks the
    # loaded libraries), so it waits for the other thread and forks a healthy worker.
    result = run_python(LOADER_LOCK.format(loader="safeloader"), timeout=60)
    assert not result.timed_out and "STALL" not in result.stdout, result
    assert "[tensor([0]), tensor([1]), tensor([2]), tensor([3])]" in result.stdout, result


# torch's bundled GNU OpenMP: the parent runs a parallel region, a worker raises its
# thread count and runs one. safeloader's threadpools backend would keep it at one thread.
OPENMP = """
import torch
from torch.utils.data import Dataset
import safeloader
LOADER = {loader!r}
torch.set_num_threads(2)
torch.ones(2_000_000).sum()  # a parallel region in the parent

class Parallel(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        torch.set_num_threads(2)
        return float(torch.ones(2_000_000).sum())

if LOADER == "torch":
    from torch.utils.data import DataLoader
    kwargs = {{}}
else:
    from safeloader import DataLoader
    kwargs = {{"stall_timeout": 2.0, "disable_hooks": ("threadpools",)}}
try:
    print(list(DataLoader(Parallel(), num_workers=1, **kwargs)))
except safeloader.WorkerStallError as error:
    print("STALL", str(error))
"""


@pytest.mark.torch_baseline
def test_torch_hangs_on_gnu_openmp_after_the_parent_ran_a_parallel_region():
    assert run_python(OPENMP.format(loader="torch"), timeout=15).timed_out


def test_a_gnu_openmp_hang_names_the_disabled_threadpools_backend():
    result = run_python(OPENMP.format(loader="safeloader"), timeout=60)
    assert not result.timed_out and "STALL" in result.stdout, result
    assert "GNU OpenMP (libgomp)" in result.stdout, result
    assert "safeloader's 'threadpools' backend is disabled for this loader" in result.stdout, result
    assert "no 'openmp' backend" not in result.stdout
