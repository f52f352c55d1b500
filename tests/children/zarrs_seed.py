"""The user's program: the parent decodes a zarrs array (a sanity read), then torch's DataLoader
reads windows of it in 2 forked workers.

argv: the array's path, and optionally ``install``: safeloader is imported and installed
after the parent opened and decoded the array. Prints ``iterating`` before the loader starts,
``all batches equal the direct read`` at the end.
"""

import sys

import numpy as np
import torch
import zarr
import zarrs  # noqa: F401

path, *late = sys.argv[1:]
zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})


class FOVDataset(torch.utils.data.Dataset):
    # As in the user's document: open lazily, read one window per item.
    def __init__(self, path):
        self.path = path

    def __len__(self):
        return 8

    def __getitem__(self, index):
        array = zarr.open_array(self.path, mode="r")
        return torch.from_numpy(array[index * 24 : index * 24 + 80, 10:250])


dataset = FOVDataset(path)
sample = dataset[0]  # the parent's sanity read: decodes several chunks
reference = zarr.open_array(path, mode="r")[:]
if late == ["install"]:
    import safeloader

    safeloader.install()
print("iterating", flush=True)
loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
for index, batch in enumerate(loader):
    assert np.array_equal(batch.numpy(), reference[index * 24 : index * 24 + 80, 10:250]), index
print("all batches equal the direct read", flush=True)
