"""SIGTERM to a process whose loader has 2 workers running: it dies of the signal."""

import os
import signal
import time

from torch.utils.data import Dataset

from safeloader import DataLoader


class Slow(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        time.sleep(0.05)
        return i


iterator = iter(DataLoader(Slow(), num_workers=2, stall_timeout=30))
next(iterator)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
