"""Workers calling a library that sets its own OpenMP thread count on every call, after the parent
ran its parallel regions (GNU OpenMP's pool live in the parent).

argv: loader case [library]
  loader   "torch" (torch's DataLoader) or "safeloader"
  case     "lightgbm-first": lightgbm imported before torch (it and torch then share the system's
           libgomp); "torch-first": torch first (both share torch's bundled copy); "renamed": the
           library at argv[3] (tests/native/omp_own_count.c, linked to a renamed libgomp copy) loaded
           before torch, each with its own copy, and the workers also raise torch's count to 2
  then, for "renamed", optionally:
  busy       another parent thread runs the library's 2-thread regions all through the loader;
             their sums are checked and counted ("busy": how many, all right)
  in-region  the loader is iterated inside a 1-thread parallel region of torch's copy (whose pool
             cannot be released there); the workers call only the library
Prints, as JSON: the libgomp copies live in the parent at the start, the parent's predictions (or
sums) and the workers', the parent's OpenMP thread counts before and after, and its results after.
"""

import ctypes
import json
import os
import sys
import time

import numpy as np

loader_name, case = sys.argv[1], sys.argv[2]
if case == "lightgbm-first":
    import lightgbm
elif case == "renamed":
    library = ctypes.CDLL(sys.argv[3])  # its libgomp copy loaded before torch's
    library.sum_squares.restype = ctypes.c_long
    library.sum_squares.argtypes = (ctypes.c_int, ctypes.c_long, ctypes.POINTER(ctypes.c_int))
import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

import safeloader  # noqa: E402
from safeloader import forkstate  # noqa: E402

THREADS = max(os.cpu_count() or 1, 2)  # as n_jobs=-1 asks for: one per core, and at least 2
ITEMS = 4


def gomp_copies() -> list[str]:
    return list(forkstate.snapshot(pools=False).gomp_loaded)


def max_threads() -> dict[str, int]:
    """Each loaded copy's omp_get_max_threads, as the calling thread's settings give it."""
    return {path: ctypes.CDLL(path, mode=os.RTLD_NOLOAD).omp_get_max_threads() for path in gomp_copies()}


if case in ("lightgbm-first", "torch-first"):
    import lightgbm

    rng = np.random.default_rng(0)
    features = rng.normal(size=(2000, 10))
    model = lightgbm.train({"objective": "regression", "verbose": -1}, lightgbm.Dataset(features, features[:, 0] * 2),
                           num_boost_round=10)
    queries = rng.normal(size=(ITEMS * 1000, 10))

    def compute(index: int) -> list:
        # num_threads: LightGBM calls omp_set_num_threads with it on every predict (its sklearn API
        # passes n_jobs there), then runs a parallel region.
        return model.predict(queries[index * 1000:(index + 1) * 1000], num_threads=THREADS).tolist()
else:
    gomp_of_torch = ctypes.CDLL(os.path.join(torch.__path__[0], "lib", "libgomp.so.1"), mode=os.RTLD_NOLOAD)
    region = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def torch_team() -> int:
        sizes = []
        body = region(lambda _: sizes.append(gomp_of_torch.omp_get_num_threads()))
        gomp_of_torch.GOMP_parallel(body, None, 0, 0)  # 0: the count torch.set_num_threads set
        return max(sizes)

    def compute(index: int) -> list:
        team = ctypes.c_int()
        total = library.sum_squares(4, 100_000 + index, ctypes.byref(team))
        if "in-region" in sys.argv[4:]:
            return [total, team.value]
        torch.set_num_threads(2)  # torch's own copy: 2 threads
        return [total, team.value, torch_team(), float((torch.ones(3000, 3000) * (index + 1)).sum())]


class Computed(Dataset):
    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> list:
        return compute(index)


torch.set_num_threads(2)
float((torch.ones(3000, 3000) * 3).sum())  # torch's own parallel region: its copy's pool live
expected = [compute(index) for index in range(ITEMS)]  # the library's own regions in the parent
torch.set_num_threads(2)
before = max_threads()
deadline = time.monotonic() + 10
while set(live := forkstate.snapshot(pools=False).gomp_live) != set(gomp_copies()) and time.monotonic() < deadline:
    time.sleep(0.02)  # each copy's pool threads, once they stop spinning, wait in their libgomp: seen live
kind = torch.utils.data.DataLoader if loader_name == "torch" else safeloader.DataLoader
loader = kind(Computed(), batch_size=None, num_workers=2)
busy: list[bool] = []
if "busy" in sys.argv[4:]:
    import threading

    done = threading.Event()

    def regions_meanwhile() -> None:
        team = ctypes.c_int()
        while not done.is_set():  # ctypes lets the GIL go: this thread is in its region during forks
            busy.append(library.sum_squares(2, 200_000, ctypes.byref(team)) == sum(i * i for i in range(200_000)))

    thread = threading.Thread(target=regions_meanwhile)
    thread.start()
    got = list(loader)
    done.set()
    thread.join()
elif "in-region" in sys.argv[4:]:
    got = []
    body = region(lambda _: got.extend(loader))
    gomp_of_torch.GOMP_parallel(body, None, 1, 0)  # the loader forks from inside torch's copy's region
else:
    got = list(loader)
print(json.dumps({
    "copies": gomp_copies(), "live": list(live), "expected": expected, "got": got,
    "threads_before": before, "threads_after": max_threads(),
    "after": [compute(index) for index in range(ITEMS)], "busy": [len(busy), all(busy)],
}))
