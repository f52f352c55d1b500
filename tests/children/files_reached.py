"""Which of the parent's read-only files a worker gets its own offset of: those its Dataset holds
(in attributes, lists, closures...), not the many the parent holds elsewhere (a shard cache).

argv: ``torch`` or ``safeloader`` (whose DataLoader runs 1 worker over 1 item), then the number of
files held elsewhere. The worker reads one byte of each file through the parent's descriptor
numbers. Prints one JSON line: {"moved": {<file>: whether the parent's offset moved}, "private":
<descriptors safeloader's worker gave their own description, or null under torch>}.
"""

import json
import os
import sys
import tempfile

import torch.utils.data

loader_name, elsewhere = sys.argv[1], int(sys.argv[2])
directory = tempfile.mkdtemp()


def opened(name: str, mode: str = "rb"):
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(b"0123456789")
    return open(path, mode)


shard_cache = [opened(f"shard{i}") for i in range(elsewhere)]  # the training script's, not the Dataset's
files: dict[str, int] = {}  # name -> descriptor, of the Dataset's files and of one shard


class Items(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.attribute = opened("attribute")
        self.listed = [opened("listed")]
        self.raw = os.open(os.path.join(directory, "attribute"), os.O_RDONLY)  # a raw descriptor number
        closed_over = opened("closure")
        self.read_closure = lambda: os.read(closed_over.fileno(), 1)
        # Kept outside the Dataset: numbers it held would name those descriptors as its own.
        files.update(attribute=self.attribute.fileno(), listed=self.listed[0].fileno(), raw=self.raw,
                     closure=closed_over.fileno(), shard0=shard_cache[0].fileno())

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> dict:
        for name, fd in files.items():
            if name != "closure":
                os.read(fd, 1)  # moves the offset: the parent's too, where shared
        self.read_closure()
        if loader_name == "torch":
            return {"private": None}
        from safeloader.backends import _reopen

        return {"private": len(_reopen.private_fds())}


if loader_name == "torch":
    loader_class = torch.utils.data.DataLoader
else:
    from safeloader import DataLoader as loader_class

dataset = Items()
(item,) = list(loader_class(dataset, batch_size=None, num_workers=1))
moved = {name: os.lseek(fd, 0, os.SEEK_CUR) != 0 for name, fd in files.items()}
print(json.dumps({"moved": moved, "private": item["private"]}))
