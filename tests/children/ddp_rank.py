"""One torchrun rank: a gloo process group, a zarrs array the rank decodes first, then a
DistributedSampler loader whose workers fork while a gloo collective is in flight.

argv: safeloader|torch (whose DataLoader), the array's path, the output folder, epochs, workers,
the loader's batch timeout. Writes rank-<rank>.json (what each epoch read) and armed-<rank> (one
line per worker the "test.ddp_armed" hook ran in) to the output folder.
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import zarr
from torch.utils.data import Dataset, DistributedSampler

import safeloader

zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
which, array_path, out_dir, epochs, workers, batch_timeout = sys.argv[1:7]
epochs, workers, batch_timeout = int(epochs), int(workers), float(batch_timeout)
Loader = safeloader.DataLoader if which == "safeloader" else torch.utils.data.DataLoader


class ZarrRows(Dataset):
    """Item i: (i, pid of the reader, row i of the array). A row spans several chunks of a shard."""

    def __init__(self, path):
        self.array = zarr.open_array(path, mode="r")

    def __len__(self):
        return self.array.shape[0]

    def __getitem__(self, index):
        return index, os.getpid(), torch.from_numpy(self.array[index])


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dataset = ZarrRows(array_path)
direct = dataset.array[:]  # the rank reads through zarrs first: its Rust pool now runs

armed_log = os.path.join(out_dir, f"armed-{rank}")


def record_armed_worker():
    context = safeloader.fork_context()
    with open(armed_log, "a") as f:
        f.write(f"{os.getpid()} {context.worker_id} {context.num_workers}\n")


safeloader.register_at_fork(after_in_child=record_armed_worker, name="test.ddp_armed")

sampler = DistributedSampler(dataset, shuffle=True, seed=7)
loader = Loader(dataset, batch_size=4, sampler=sampler, num_workers=workers, timeout=batch_timeout)
report = {"rank": rank, "world": world, "pid": os.getpid(), "epochs": []}
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    expected_order = list(sampler)  # torch's own DistributedSampler order for this epoch
    # A gloo collective runs on gloo's threads while this rank forks its workers.
    in_flight = dist.all_reduce(torch.ones(1), async_op=True)
    seen, reader_pids, mismatches = [], [], 0
    for indices, pids, rows in loader:
        mismatches += int(not np.array_equal(rows.numpy(), direct[indices.numpy()]))
        seen += indices.tolist()
        reader_pids += pids.tolist()
    in_flight.wait()
    everyone = [None] * world
    dist.all_gather_object(everyone, seen)
    report["epochs"].append(
        {"seen": seen, "expected_order": expected_order, "reader_pids": sorted(set(reader_pids)),
         "mismatched_batches": mismatches, "all_ranks": everyone}
    )
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(report, f)
dist.destroy_process_group()
