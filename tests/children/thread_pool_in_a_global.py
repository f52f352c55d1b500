"""A multiprocessing.pool.ThreadPool in a module global (as dask's ``dask.config.set(pool=...)``
keeps one), used in the parent; 2 workers compute their items on it.

argv: ``torch`` or ``safeloader`` (whose DataLoader). Prints the items, then whether the
parent's pool still works.
"""

import operator
import sys
from multiprocessing.pool import ThreadPool

import torch

import safeloader

POOL = ThreadPool(2)


class ComputesOnTheGlobalPool(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> int:
        return POOL.apply(operator.mul, (index, 10)) + sum(POOL.map(abs, [-1, -2]))


dataset = ComputesOnTheGlobalPool()
assert dataset[0] == 3  # the pool's threads are live in the parent
loader_class = torch.utils.data.DataLoader if sys.argv[1] == "torch" else safeloader.DataLoader
for _epoch in range(2):
    print(sorted(int(item) for item in loader_class(dataset, batch_size=None, num_workers=2)), flush=True)
print("PARENT", POOL.apply(operator.add, (3, 4)), len(POOL._pool))
POOL.close()
POOL.join()
