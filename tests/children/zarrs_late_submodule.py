"""A zarrs submodule imported after the first loader start: its ChunkItem must be the worker
copy's. argv: the array's path. Prints ``both loaders read exactly``."""

import os
import sys
import tempfile

import numpy as np
import torch
import zarr
import zarrs

import safeloader

path = sys.argv[1]
zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
# A zarrs submodule that is not loaded yet (zarrs 0.2.3 imports all of its own
# with the package): it binds an object of zarrs._internal when imported.
extra = tempfile.mkdtemp()
with open(os.path.join(extra, "_late.py"), "w") as module:
    module.write(
        "from ._internal import ChunkItem\n"
        "def first_chunk():\n"
        "    whole = [slice(0, 64), slice(0, 64)]\n"
        "    return ChunkItem(key='c/0/0', chunk_subset=whole, chunk_shape=[64, 64], subset=whole, shape=[64, 64])\n"
    )
zarrs.__path__.append(extra)


class Reads(torch.utils.data.Dataset):
    # Item: a window read by zarr, and the first chunk read through zarrs._late if loaded.
    def __init__(self):
        self.array = zarr.open_array(path, mode="r")

    def __len__(self):
        return 4

    def __getitem__(self, index):
        window = torch.from_numpy(self.array[index * 40 : index * 40 + 90, 30:200])
        late = sys.modules.get("zarrs._late")
        if late is None:
            return window, None
        chunk = np.empty((64, 64), dtype=np.float32)
        self.array._async_array.codec_pipeline.impl.retrieve_chunks_and_apply_index([late.first_chunk()], chunk)
        return window, torch.from_numpy(chunk)


dataset = Reads()
reference = dataset.array[:]  # the parent decodes with zarrs: workers need their own pool


def check(loader, late):
    for index, (window, chunk) in enumerate(loader):
        assert np.array_equal(window.numpy(), reference[index * 40 : index * 40 + 90, 30:200]), index
        assert (chunk is None) == (not late)
        assert late is False or np.array_equal(chunk.numpy(), reference[:64, :64]), index


check(safeloader.DataLoader(dataset, batch_size=None, num_workers=2, timeout=30), late=False)
import zarrs._late  # noqa: E402  (after the first loader start)

check(safeloader.DataLoader(dataset, batch_size=None, num_workers=2, timeout=30), late=True)
print("both loaders read exactly", flush=True)
