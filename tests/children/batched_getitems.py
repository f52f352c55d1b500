"""A Dataset with ``__getitems__``: each call fetches 32 items of 0.1 s (3.2 s) with stall_timeout=1.
Prints ``complete`` once every item came back in order."""

import time

import torch  # noqa: F401
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
