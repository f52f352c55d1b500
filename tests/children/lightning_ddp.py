"""Lightning's DDP strategy on CPU (2 ranks) fits a model on a safeloader loader; Lightning rebuilds
the loader with its DistributedSampler. Lightning's launcher runs this file again for the other rank.

argv: the output folder. Each rank writes rank-<rank>.json (what it read, and the loader Lightning
used) and armed-<rank> (the pids of the workers the "test.lightning_ddp" hook ran in).
"""

import json
import os
import sys

import lightning
import torch
from torch.utils.data import Dataset

import safeloader

out_dir = sys.argv[1]


class Numbered(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        return index, os.getpid()


class Model(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen, self.pids = [], set()

    def training_step(self, batch, batch_index):
        indices, pids = batch
        self.seen += indices.tolist()
        self.pids |= set(pids.tolist())
        x = indices.float().unsqueeze(1)
        return torch.nn.functional.mse_loss(self.layer(x), 2 * x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def record_armed_worker():
    with open(os.path.join(out_dir, f"armed-{os.environ.get('LOCAL_RANK', '0')}"), "a") as f:
        f.write(f"{os.getpid()}\n")


safeloader.register_at_fork(after_in_child=record_armed_worker, name="test.lightning_ddp")
loader = safeloader.DataLoader(Numbered(), batch_size=2, shuffle=True, num_workers=2,
                               zarrs_mode="serial", thread_budget=1)
model = Model()
trainer = lightning.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1,
                            enable_checkpointing=False, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=out_dir)
trainer.fit(model, train_dataloaders=loader)
used = trainer.train_dataloader
report = {
    "rank": trainer.global_rank, "pid": os.getpid(), "seen": model.seen, "reader_pids": sorted(model.pids),
    "type": type(used).__qualname__, "sampler": type(used.sampler).__qualname__,
    "options": [used.zarrs_mode, used.thread_budget], "num_workers": used.num_workers,
    "finished": trainer.state.finished,
}
with open(os.path.join(out_dir, f"rank-{trainer.global_rank}.json"), "w") as f:
    json.dump(report, f)
