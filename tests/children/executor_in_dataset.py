"""A Dataset holding a ThreadPoolExecutor, used once in the parent; 2 workers submit to it.

argv: ``torch`` or ``safeloader`` (whose DataLoader). Prints the items, then whether the
parent's executor still works and how many threads it has.
"""

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

import safeloader


class SubmitsToItsExecutor(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=2)

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple[int, str]:
        name = self.executor.submit(lambda: threading.current_thread().name).result()
        return index * 10 + len(self.executor._threads), name.split("_")[0]


dataset = SubmitsToItsExecutor()
assert dataset[0][0] == 1  # its thread is live in the parent
loader_class = torch.utils.data.DataLoader if sys.argv[1] == "torch" else safeloader.DataLoader
print(sorted(tuple(item) for item in loader_class(dataset, batch_size=None, num_workers=2)), flush=True)
print("PARENT", dataset.executor.submit(lambda: 7).result(), len(dataset.executor._threads))
