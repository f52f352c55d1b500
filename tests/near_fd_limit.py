"""Child script: a 2-worker loader sending tensors with only N spare file descriptors.

python -m tests.near_fd_limit torch|safeloader N  ->  prints OK <batches> or ERR <type> <message>
"""

import os
import resource
import sys

import torch
from torch.utils.data import Dataset

which, spare = sys.argv[1], int(sys.argv[2])

if which == "torch":
    from torch.utils.data import DataLoader
else:
    from safeloader import DataLoader


class D(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.full((64,), float(i))


used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    out = [b for b in DataLoader(D(), batch_size=4, num_workers=2)]
    print("OK", len(out))
except Exception as e:
    print("ERR", type(e).__name__, str(e).replace("\n", " "))
