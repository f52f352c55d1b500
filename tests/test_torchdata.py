"""torchdata's StatefulDataLoader with safeloader.install(): imported before or after it, it loads
a zarrs Dataset whose parent decoded first, and resumes mid-epoch from ``state_dict()``.

StatefulDataLoader is ``class StatefulDataLoader(DataLoader[_T_co])`` with its own
``_get_iterator`` and worker loop: imported after ``install()`` it subclasses
SafeDataLoader (which must be generic for the import to work), and its worker
forks are recognised by install() through torchdata's ``_worker_loop``. Each
program runs in a fresh interpreter, since the import order is the point.
"""

from __future__ import annotations

import pytest

from .subproc import check_python, run_python
from .zarrs_data import write_arrays

pytestmark = pytest.mark.timeout(120)

PROGRAM = """
import numpy as np
import torch
import zarr
import zarrs

ORDER = {order!r}
if ORDER == "install, then import torchdata":
    import safeloader
    safeloader.install()
from torchdata.stateful_dataloader import StatefulDataLoader
if ORDER == "import torchdata, then install":
    import safeloader
    safeloader.install()
zarr.config.set({{"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}})


class Windows(torch.utils.data.Dataset):
    # The array is opened (and decoded) in the parent; item i is a window across several chunks.
    def __init__(self, path):
        self.array = zarr.open_array(path, mode="r")
    def __len__(self):
        return 12
    def __getitem__(self, index):
        return index, torch.from_numpy(np.ascontiguousarray(self.array[index * 12 : index * 12 + 90, 5:200]))


dataset = Windows({path!r})


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
"""


@pytest.fixture(scope="module")
def plain_array(tmp_path_factory) -> str:
    return write_arrays(tmp_path_factory.mktemp("torchdata"))["plain"]


@pytest.mark.torch_baseline
def test_stateful_dataloader_hangs_without_safeloader(plain_array):
    result = run_python(PROGRAM.format(order="torch only", path=plain_array), timeout=20)
    assert result.timed_out, f"torchdata's loader was expected to hang after the parent decoded:\n{result}"
    assert "iterating" in result.stdout


@pytest.mark.parametrize("order", ["install, then import torchdata", "import torchdata, then install"])
def test_stateful_dataloader_loads_and_resumes_mid_epoch_under_install(plain_array, order):
    result = check_python(PROGRAM.format(order=order, path=plain_array), timeout=90)
    assert "resumed with the same remaining batches" in result.stdout
