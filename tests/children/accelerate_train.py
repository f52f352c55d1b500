"""HF Accelerate (CPU) prepares a loader over ZarrBlocks after the training process decoded the array,
and trains an epoch (mode ``stateful``: 3 batches, a checkpoint, then a fresh loader resumed from it).

argv: the output folder; ``torch`` (no safeloader), ``install``, ``dispatcher`` or ``stateful``
(safeloader.install() first). Prints ``@@`` and a JSON report; armed workers append their pid to
armed-<parent's pid>.
"""

import json
import sys

import numpy as np  # noqa: F401
import torch
from torch.utils.data import DataLoader

import safeloader
from tests.children.zarr_blocks import ZarrBlocks, matches_direct_read, record_armed_worker
from tests.zarrs_data import write_arrays

OUT, MODE = sys.argv[1], sys.argv[2]
TIMEOUT = 5 if MODE == "torch" else 20  # torch's workers hang on their first item: seen after 5 s
PATH = write_arrays(OUT)["plain"]

if MODE != "torch":
    safeloader.install()
    safeloader.register_at_fork(after_in_child=lambda: record_armed_worker(OUT), name="test.accelerate_armed")

from accelerate import Accelerator  # noqa: E402  (after install(): accelerate sees the armed class)
from accelerate.utils import DataLoaderConfiguration  # noqa: E402

config = DataLoaderConfiguration(dispatch_batches=MODE == "dispatcher", use_stateful_dataloader=MODE == "stateful")
accelerator = Accelerator(cpu=True, dataloader_config=config)
dataset = ZarrBlocks(PATH)
dataset[0]  # the training process decodes first
shuffle = MODE != "stateful"  # resuming is checked against the plain order


def new_loader():
    return DataLoader(
        dataset, batch_size=2, shuffle=shuffle, num_workers=2, timeout=TIMEOUT,
        generator=torch.Generator().manual_seed(0),
    )


model = torch.nn.Linear(256, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
model, optimizer, prepared = accelerator.prepare(model, optimizer, new_loader())
seen, resumed, correct, state = [], [], True, None


def train_step(indices, blocks):
    global correct
    loss = model(blocks).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    correct &= matches_direct_read(indices.tolist(), blocks)


for n, (indices, blocks) in enumerate(prepared):
    train_step(indices, blocks)
    seen += indices.tolist()
    if MODE == "stateful" and n == 2:
        state = prepared.state_dict()  # checkpoint mid-epoch
        break
if state is not None:
    again = accelerator.prepare_data_loader(new_loader())
    again.load_state_dict(state)  # resume in a fresh loader
    for indices, blocks in again:
        train_step(indices, blocks)
        resumed += indices.tolist()
inner = getattr(prepared, "base_dataloader", prepared)
report = {"type": type(prepared).__qualname__, "inner": type(inner).__qualname__}
print("@@" + json.dumps(report | {"seen": seen, "resumed": resumed, "correct": correct}))
