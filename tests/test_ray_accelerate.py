"""Ray Train and HF Accelerate, run for real on the CPU, reading a zarr array through zarrs.

Both rebuild the user's loader from torch's class, so only ``safeloader.install()``
arms its workers:

- Ray Train runs the training function in separate worker processes (actors);
  ``install()`` must run there, at the top of the training function. Each rank's
  ``prepare_data_loader`` loader then forks armed workers.
- Accelerate (1.15) wraps the loader it rebuilds in ``DataLoaderShard`` /
  ``DataLoaderDispatcher`` (adapters around a torch ``DataLoader``, or torchdata's
  ``StatefulDataLoader`` with ``use_stateful_dataloader=True``).

Each case first shows the failure: the training process decodes once (zarrs'
Rust pool now exists in it), and torch's forked workers then hang on their
first multi-chunk read; the loader's own ``timeout`` turns the hang into
"DataLoader timed out", and the child process runs under a deadline as well.
Everything runs in a child process (``run_python``), so Ray's processes and any
hung worker die with its process group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .subproc import run_python

ROOT = Path(__file__).resolve().parent.parent
HANG = "DataLoader timed out"

# A Dataset as users write it: the array is opened in __init__. Item i is rows
# 16i..16i+16 of a 256x256 array in 64x64 chunks: a 4-chunk read.
DATASET = r'''
import json, os, sys
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
sys.path.insert(0, os.getcwd())
from tests.zarrs_data import expected, write_arrays, zarrs_pipeline

OUT, MODE = sys.argv[1], sys.argv[2]
PATH = write_arrays(OUT)["plain"]


class ZarrBlocks(Dataset):
    def __init__(self, path):
        import zarr
        with zarrs_pipeline():
            self.array = zarr.open_array(path, mode="r")

    def __len__(self):
        return self.array.shape[0] // 16

    def __getitem__(self, i):
        return i, torch.from_numpy(self.array[16 * i:16 * (i + 1)])


def matches_direct_read(indices, blocks):
    direct = expected()  # what was written: a direct read gives exactly this
    return bool(np.array_equal(blocks.numpy().reshape(-1, 256),
                               np.concatenate([direct[16 * i:16 * (i + 1)] for i in indices])))


def record_armed_worker():
    with open(os.path.join(OUT, f"armed-{os.getppid()}"), "a") as f:
        f.write(f"{os.getpid()}\n")
'''

RAY_SCRIPT = DATASET + r'''

def train_loop(config):
    if config["install"]:
        # Ray Train runs this function in its own worker processes: install() here.
        import safeloader
        safeloader.install()
        safeloader.register_at_fork(after_in_child=record_armed_worker, name="test.ray_armed")
    import ray.train
    import ray.train.torch

    dataset = config["dataset"]
    dataset[0]  # the training process decodes first: zarrs' pool now exists here
    loader = DataLoader(dataset, batch_size=2, num_workers=2, timeout=20)
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    seen, correct = [], True
    for indices, blocks in loader:
        correct &= matches_direct_read(indices.tolist(), blocks)
        seen += indices.tolist()
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "seen": seen, "correct": correct,
                   "type": type(loader).__qualname__, "sampler": type(loader.sampler).__qualname__}, f)


import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
try:
    dataset = ZarrBlocks(PATH)
    dataset[0]  # the driver reads too, as users check their data
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"dataset": dataset, "install": MODE == "install", "out": OUT},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=os.path.join(OUT, "ray"), name="run"),
    )
    trainer.fit()
finally:
    ray.shutdown()
'''

ACCELERATE_SCRIPT = DATASET + r'''
import safeloader

if MODE != "torch":
    safeloader.install()
    safeloader.register_at_fork(after_in_child=record_armed_worker, name="test.accelerate_armed")

from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

config = DataLoaderConfiguration(dispatch_batches=MODE == "dispatcher", use_stateful_dataloader=MODE == "stateful")
accelerator = Accelerator(cpu=True, dataloader_config=config)
dataset = ZarrBlocks(PATH)
dataset[0]  # the training process decodes first
shuffle = MODE != "stateful"  # resuming is checked against the plain order


def new_loader():
    return DataLoader(dataset, batch_size=2, shuffle=shuffle, num_workers=2, timeout=20,
                      generator=torch.Generator().manual_seed(0))


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
print("@@" + json.dumps({"type": type(prepared).__qualname__, "inner": type(inner).__qualname__,
                         "seen": seen, "resumed": resumed, "correct": correct}))
'''


def run_script(script: str, tmp_path: Path, mode: str, timeout: float):
    out = tmp_path / "out"
    out.mkdir()
    code = f"import sys; sys.argv = ['script', {str(out)!r}, {mode!r}]\n" + script
    env = {"RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    return run_python(code, timeout=timeout, env=env, cwd=str(ROOT)), out


def armed_workers(out: Path, parent_pid: int) -> set[int]:
    path = out / f"armed-{parent_pid}"
    return {int(pid) for pid in path.read_text().split()} if path.exists() else set()


@pytest.mark.torch_baseline
@pytest.mark.timeout(200)
def test_ray_train_without_install_hangs_after_the_training_process_decoded(tmp_path):
    result, out = run_script(RAY_SCRIPT, tmp_path, "torch", timeout=180)
    assert result.timed_out or result.returncode != 0, str(result)
    assert HANG in result.stdout + result.stderr or result.timed_out, str(result)
    assert not list(out.glob("rank-*.json"))  # no rank got through its epoch


@pytest.mark.timeout(200)
def test_ray_train_with_install_in_the_train_function_every_rank_reads_its_shard(tmp_path):
    result, out = run_script(RAY_SCRIPT, tmp_path, "install", timeout=180)
    assert not result.timed_out and result.returncode == 0, str(result)
    reports = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert sorted(i for r in reports for i in r["seen"]) == list(range(16))  # disjoint shards, complete
    for report in reports:
        assert report["correct"], report  # every block equals a direct read
        assert report["type"] == "DataLoader" and report["sampler"] == "DistributedSampler"
        assert len(report["seen"]) == 8
        assert len(armed_workers(out, report["pid"])) == 2  # its 2 workers ran safeloader's hooks


def accelerate_report(result) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith("@@")]
    assert lines, str(result)
    return json.loads(lines[-1][2:])


@pytest.mark.torch_baseline
@pytest.mark.timeout(120)
def test_accelerate_without_install_hangs_after_the_training_process_decoded(tmp_path):
    result, _ = run_script(ACCELERATE_SCRIPT, tmp_path, "torch", timeout=100)
    assert result.timed_out or (result.returncode != 0 and HANG in result.stderr), str(result)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "wrapper", "inner"),
    [
        ("install", "DataLoaderShard", "SafeDataLoader"),  # accelerate imported after install()
        ("dispatcher", "DataLoaderDispatcher", "SafeDataLoader"),
        ("stateful", "DataLoaderShard", "StatefulDataLoader"),
    ],
)
def test_accelerate_prepared_loader_is_armed_after_install(tmp_path, mode, wrapper, inner):
    result, out = run_script(ACCELERATE_SCRIPT, tmp_path, mode, timeout=100)
    assert not result.timed_out and result.returncode == 0, str(result)
    report = accelerate_report(result)
    assert (report["type"], report["inner"]) == (wrapper, inner)
    assert report["correct"]  # every block equals a direct read
    armed = {int(pid) for path in out.glob("armed-*") for pid in path.read_text().split()}
    if mode == "stateful":
        # 3 batches, a checkpoint, then a fresh loader resumed from it: the epoch exactly once.
        assert report["seen"] == list(range(6)) and report["resumed"] == list(range(6, 16))
        # Both loaders' workers ran the hooks; resuming StatefulDataLoader may start its workers once more.
        assert len(armed) >= 4 and len(armed) % 2 == 0, armed
    else:
        assert sorted(report["seen"]) == list(range(16)) and report["resumed"] == []
        assert len(armed) == 2
