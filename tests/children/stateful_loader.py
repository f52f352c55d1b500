"""torchdata's StatefulDataLoader over a zarrs array the parent decoded first; resumed mid-epoch
from ``state_dict()``.

argv: the import order (``install, then import torchdata``, ``import torchdata,
then install`` or ``torch only``), the zarr array's path.
"""

import sys

import numpy as np
import torch
import zarr
import zarrs  # noqa: F401

ORDER, PATH = sys.argv[1:]
if ORDER == "install, then import torchdata":
    import safeloader

    safeloader.install()
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

if ORDER == "import torchdata, then install":
    import safeloader

    safeloader.install()
zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})


class Windows(torch.utils.data.Dataset):
    # The array is opened (and decoded) in the parent; item i is a window across several chunks.
    def __init__(self, path):
        self.array = zarr.open_array(path, mode="r")

    def __len__(self):
        return 12

    def __getitem__(self, index):
        return index, torch.from_numpy(np.ascontiguousarray(self.array[index * 12 : index * 12 + 90, 5:200]))


dataset = Windows(PATH)


def make_loader():
    generator = torch.Generator().manual_seed(1234)
    return StatefulDataLoader(dataset, batch_size=2, shuffle=True, generator=generator, num_workers=2, timeout=30)


reference = [dataset[index][1] for index in range(len(dataset))]  # direct reads: the parent decodes
if ORDER == "install, then import torchdata":
    assert issubclass(StatefulDataLoader, safeloader.SafeDataLoader)
print("iterating", flush=True)
loader = make_loader()
iterator = iter(loader)
head = [next(iterator) for _ in range(3)]
state = loader.state_dict()  # mid-epoch: 3 of 6 batches taken
tail = list(iterator)
del iterator
epoch = [(int(index), data) for indices, batch in head + tail for index, data in zip(indices, batch, strict=True)]
assert sorted(index for index, _ in epoch) == list(range(12))  # each item once
assert all(torch.equal(data, reference[index]) for index, data in epoch)  # value for value

resumed = make_loader()
resumed.load_state_dict(state)
remaining = list(resumed)
assert len(remaining) == len(tail) == 3, len(remaining)
for (got_indices, got), (want_indices, want) in zip(remaining, tail, strict=True):
    assert torch.equal(got_indices, want_indices) and torch.equal(got, want)
print("resumed with the same remaining batches", flush=True)
