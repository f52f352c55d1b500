"""A loader started right after a BLAS call, while OpenBLAS's threads still spin for work (for about
0.4 s here: THREAD_TIMEOUT=30, read each time OpenBLAS starts its threads) when the fork-time check
reads them. Argument: "stop" (as safeloader runs), "wait" (the check without OpenBLAS's threads
stopped first: it waits up to 50 ms for them), "thread" (as safeloader runs, with another Python
thread alive, idle: it waits on an Event, where it cannot enter BLAS, so the threads are stopped),
"busy" (the stop the check makes, asked for three times while another Python thread is inside
numpy's BLAS: nothing is stopped; no loader starts, as OpenBLAS's own fork handler would hang the
fork itself here, under torch's loader too) or "busy-unchecked" (the same, stopped without the
check: what it prevents, a product that never returns).
Prints JSON: the check's pauses, how many threads ran at the start, how many copies were stopped,
whether BLAS still computes, the batches, and the other thread's products (all right, how many,
whether the thread ended).
"""

import json
import os
import sys
import threading
import time
import types

os.environ["THREAD_TIMEOUT"] = "30"

import numpy
import torch

import safeloader
from safeloader import _fork_check, native
from safeloader.backends import _blas_pools, threadpools
from safeloader.diagnostics import thread_owners

if sys.argv[1] == "wait":
    _fork_check._stop_openblas_servers = lambda options: None
if sys.argv[1] == "busy-unchecked":
    _blas_pools.stop_while_parked = lambda stops: sum(1 for stop in stops if stop())
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
products: list[bool] = []
if sys.argv[1].startswith("busy"):  # another Python thread inside BLAS when the check stops
    inside = threading.Event()

    def multiply() -> None:
        big = numpy.ones((2048, 2048))  # each product takes 0.1-0.5 s: the stops fall inside the first
        while not release.is_set():
            inside.set()
            products.append(bool(((big @ big) == 2048.0).all()))

    busy = threading.Thread(target=multiply, daemon=True)
    busy.start()
    inside.wait()
    for _ in range(3):
        time.sleep(0.02)
        threadpools.stop_openblas_servers()
    release.set()
    busy.join(20)  # a product whose job a stop lost never returns
    print(json.dumps({"stopped": sum(stops), "products": [all(products), len(products)],
                      "ended": not busy.is_alive()}), flush=True)
    os._exit(0)  # not waiting for a lost product at exit
matrix = numpy.ones((512, 512))
matrix @ matrix  # OpenBLAS's threads work, then spin
running = sum(thread_owners._is_running(tid) for tid, _ in native.thread_census().foreign)
batches = [batch.flatten().tolist() for batch in safeloader.DataLoader(Items(), batch_size=4, num_workers=2)]
release.set()
computes = bool(((matrix @ matrix) == 512.0).all())  # the pool, started again after the stop
print(json.dumps({"pauses": len(pauses), "running": running, "stopped": sum(stops), "computes": computes,
                  "batches": batches}))
