"""A loader started right after a BLAS call, while OpenBLAS's threads still spin for work (for about
0.4 s here: THREAD_TIMEOUT=30, read each time OpenBLAS starts its threads) when the fork-time check
reads them. Argument: "stop" (as safeloader runs), "wait" (the check without OpenBLAS's threads
stopped first: it waits up to 50 ms for them) or "thread" (as safeloader runs, with another Python
thread alive, which could be inside BLAS: nothing is stopped). Prints JSON: the check's pauses, how
many threads ran at the start, how many copies were stopped, whether BLAS still computes, the batches.
"""

import json
import os
import sys
import threading
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
stops = []
stop = threadpools.stop_openblas_servers
threadpools.stop_openblas_servers = lambda: stops.append(stop()) or stops[-1]
pauses = []
thread_owners.time = types.SimpleNamespace(sleep=pauses.append)  # the check's waits, counted


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


release = threading.Event()
if sys.argv[1] == "thread":  # another Python thread, idle here, but the stop cannot know it is
    threading.Thread(target=release.wait, daemon=True).start()
matrix = numpy.ones((512, 512))
matrix @ matrix  # OpenBLAS's threads work, then spin
running = sum(thread_owners._is_running(tid) for tid, _ in native.thread_census().foreign)
batches = [batch.flatten().tolist() for batch in safeloader.DataLoader(Items(), batch_size=4, num_workers=2)]
release.set()
computes = bool(((matrix @ matrix) == 512.0).all())  # the pool, started again after the stop
print(json.dumps({"pauses": len(pauses), "running": running, "stopped": sum(stops), "computes": computes,
                  "batches": batches}))
