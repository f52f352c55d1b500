"""One loader iterated from 4 threads at once, 5 times: it keeps its attributes and its watchdog.

Prints ``stall reported: WorkerStallError`` once a stuck item is reported.
"""

import threading
import time

from torch.utils.data import Dataset

import safeloader
from safeloader import DataLoader


class Items(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return i


def my_init(worker_id):
    pass


loader = DataLoader(Items(), batch_size=3, num_workers=2, worker_init_fn=my_init, stall_timeout=1.0)


def run(results, k):
    results[k] = sorted(int(x) for batch in loader for x in batch)


for _ in range(5):
    results = {}
    threads = [threading.Thread(target=run, args=(results, k)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == list(range(12)) for r in results.values()) and len(results) == 4, results
    assert loader.worker_init_fn is my_init, loader.worker_init_fn
    assert loader.multiprocessing_context is None


# The watchdog is still on for this loader: a stuck item is reported.
class Stuck(Items):
    def __getitem__(self, i):
        if i == 5:
            time.sleep(60)
        return i


loader.dataset.__class__ = Stuck
try:
    list(loader)
except safeloader.WorkerStallError as error:
    print("stall reported:", type(error).__name__)
