"""Shared by the threadpools child scripts (imported, not run): an OpenMP parallel region at
libgomp's default thread count, as a C extension built with -fopenmp runs it (torch's own ops
use torch's count instead), the pool counts threadpoolctl reports, and a Dataset reporting both
from a worker."""

import ctypes
import json
import os
import time

import numpy  # noqa: F401
import threadpoolctl
import torch
from torch.utils.data import Dataset

import safeloader

_gomp = ctypes.CDLL(os.path.join(torch.__path__[0], "lib", "libgomp.so.1"))
_REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def openmp_team_size():
    sizes = []
    body = _REGION(lambda _: sizes.append(_gomp.omp_get_num_threads()))
    _gomp.GOMP_parallel(body, None, 0, 0)  # 0 threads: the default (ICV) count
    return max(sizes)


def pools():
    return {i["internal_api"]: i["num_threads"] for i in threadpoolctl.threadpool_info()}


class Report(Dataset):
    """Each item: the worker's pool counts, after running OpenMP code both ways."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        team = openmp_team_size()
        total = float((torch.ones(1500, 1500) * 2).sum())  # torch's own parallel region
        return json.dumps({"pools": pools(), "torch": torch.get_num_threads(), "team": team, "total": total})


def settle():
    # Threads of the previous loader (queue feeders) may still be exiting: a thread the
    # fork-time record cannot attribute makes the backend assume OpenMP is live (1 thread).
    deadline = time.monotonic() + 10
    while safeloader.native.thread_census().foreign and time.monotonic() < deadline:
        time.sleep(0.05)


def run(loader):
    settle()
    iterator = iter(loader)
    try:
        return [json.loads(item) for item in iterator]
    finally:
        iterator._shutdown_workers()  # at once, also after a worker error
