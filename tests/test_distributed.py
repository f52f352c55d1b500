"""safeloader under torchrun: 2 gloo ranks on CPU, each forking 2 armed workers.

Each rank is a process that already holds threads (gloo's, and zarrs' Rust pool
after a read in the rank itself) when its DataLoader forks workers, and one of
gloo's collectives is in flight at each fork. The ranks run under ``torchrun``
(a c10d rendezvous on 127.0.0.1, gloo on the loopback interface) inside a
subprocess with a deadline, so a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import json
import sys
import uuid

import numpy as np
import pytest
import zarr

from .subproc import run_python

pytestmark = pytest.mark.timeout(180)

LENGTH = 40  # divisible by the world size: DistributedSampler pads nothing
ROW = 64
WORLD = 2
EPOCHS = 2
WORKERS = 2

RANK_SCRIPT = r'''
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
'''

TORCHRUN = """
import sys
from torch.distributed.run import main
sys.argv = {argv!r}
main()
"""


@pytest.fixture(scope="module")
def chunked_array(tmp_path_factory) -> tuple[str, np.ndarray]:
    """A compressed (LENGTH, ROW) array, one shard per row, each of 8 chunks.

    Reading a row decodes its 8 chunks on zarrs' Rust thread pool, which a
    forked worker inherits without its threads.
    """
    path = str(tmp_path_factory.mktemp("ddp") / "rows.zarr")
    data = np.arange(LENGTH * ROW, dtype="float32").reshape(LENGTH, ROW)
    array = zarr.create_array(path, shape=data.shape, shards=(1, ROW), chunks=(1, 8), dtype="float32")
    array[:] = data
    return path, data


def run_ranks(tmp_path, array_path: str, which: str, batch_timeout: float, deadline: float):
    out_dir = tmp_path / f"out-{which}"  # not a module name: the script's folder is on sys.path
    out_dir.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    argv = [
        "torchrun",
        "--nnodes=1",
        f"--nproc-per-node={WORLD}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",  # a free port on the loopback interface only
        f"--rdzv-id={uuid.uuid4().hex}",
        "--max-restarts=0",
        "--monitor-interval=0.2",
        str(script),
        which, array_path, str(out_dir), str(EPOCHS), str(WORKERS), str(batch_timeout),
    ]
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    result = run_python(TORCHRUN.format(argv=argv), timeout=deadline, env=env)
    return result, out_dir


def test_two_gloo_ranks_with_zarrs_read_first_see_every_index_once(tmp_path, chunked_array):
    array_path, _ = chunked_array
    result, out_dir = run_ranks(tmp_path, array_path, "safeloader", batch_timeout=30, deadline=150)
    assert not result.timed_out and result.returncode == 0, f"torchrun failed:\n{result}"

    reports = [json.loads((out_dir / f"rank-{rank}.json").read_text()) for rank in range(WORLD)]
    assert [r["world"] for r in reports] == [WORLD] * WORLD
    orders = []
    for epoch in range(EPOCHS):
        per_rank = [r["epochs"][epoch] for r in reports]
        for report in per_rank:
            # Value for value what the rank read directly, in torch's sampler order.
            assert report["mismatched_batches"] == 0
            assert report["seen"] == report["expected_order"]
            assert len(report["seen"]) == LENGTH // WORLD
            assert report["all_ranks"] == [p["seen"] for p in per_rank]
        together = sorted(i for p in per_rank for i in p["seen"])
        assert together == list(range(LENGTH))  # disjoint and complete
        orders.append([p["seen"] for p in per_rank])
    assert orders[0] != orders[1]  # set_epoch reshuffled

    for report in reports:
        rank = report["rank"]
        lines = (out_dir / f"armed-{rank}").read_text().split()
        armed = [tuple(int(v) for v in lines[i : i + 3]) for i in range(0, len(lines), 3)]
        # The hook ran in each worker of each epoch, and those workers did the reading.
        assert sorted(w for _, w, _ in armed) == sorted(list(range(WORKERS)) * EPOCHS)
        assert {n for _, _, n in armed} == {WORKERS}
        armed_pids = {pid for pid, _, _ in armed}
        readers = {pid for e in report["epochs"] for pid in e["reader_pids"]}
        assert readers == armed_pids and report["pid"] not in armed_pids


def test_same_ranks_with_torch_loader_hang_in_the_workers(tmp_path, chunked_array):
    # The failure the previous test guards against: torch's own loader, same
    # ranks and Dataset; the forked workers wait forever on the zarrs pool they
    # inherited without its threads, so no batch arrives within the loader's timeout.
    array_path, _ = chunked_array
    result, _ = run_ranks(tmp_path, array_path, "torch", batch_timeout=10, deadline=120)
    assert not result.timed_out, f"torchrun did not even fail in time:\n{result}"
    assert result.returncode != 0
    assert "DataLoader timed out after 10" in result.stderr, str(result)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
