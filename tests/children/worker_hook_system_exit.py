"""A worker hook raising SystemExit(3), with a file open in the Dataset: the parent gets a HookError.

argv: the file to open. Prints ``HookError: <message>``.
"""

import sys

from torch.utils.data import Dataset

import safeloader
from safeloader import DataLoader, HookError

path = sys.argv[1]


def raising():
    raise SystemExit(3)


safeloader.register_at_fork(after_in_child=raising, name="raising", first=True)


class D(Dataset):
    def __init__(self):
        self.f = open(path, "rb")

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


try:
    list(DataLoader(D(), num_workers=1))
except HookError as error:
    print("HookError:", error)
