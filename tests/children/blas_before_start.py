"""A loader started right after a BLAS call, while OpenBLAS's threads still spin for work (for about
0.4 s here: THREAD_TIMEOUT=30, read each time OpenBLAS starts its threads) when the fork-time check
reads them. Argument: "stop" (as safeloader runs) or "wait" (the check without OpenBLAS's threads
stopped first: it waits up to 50 ms for them). Prints JSON: the check's pauses, how many threads
ran at the start, the batches.
"""

import json
import os
import sys
import types

os.environ["THREAD_TIMEOUT"] = "30"

import numpy
import torch

import safeloader
from safeloader import _fork_check, native
from safeloader.backends import threadpools
from safeloader.diagnostics import thread_owners

if sys.argv[1] == "wait":
    _fork_check._stop_openblas_servers = lambda options: None
threadpools.stop_openblas_servers()  # started again by the product below, with the variable above
pauses = []
thread_owners.time = types.SimpleNamespace(sleep=pauses.append)  # the check's waits, counted


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


matrix = numpy.ones((512, 512))
matrix @ matrix  # OpenBLAS's threads work, then spin
running = sum(thread_owners._is_running(tid) for tid, _ in native.thread_census().foreign)
batches = [batch.flatten().tolist() for batch in safeloader.DataLoader(Items(), batch_size=4, num_workers=2)]
print(json.dumps({"pauses": len(pauses), "running": running, "batches": batches}))
