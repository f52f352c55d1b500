"""Ray Train (2 CPU workers) trains on ZarrBlocks; each rank's prepare_data_loader loader forks
2 workers after the rank decoded the array.

argv: the output folder, then the runs, in order, in one Ray session (starting Ray is most of
the cost): ``torch`` (the user's loader as it is) and/or ``install`` (safeloader.install() at the
top of the training function). Each run prints ``@@<run> ok`` or ``@@<run> failed: <error>``;
each rank writes <run>/rank-<rank>.json; armed workers append their pid to <run>/armed-<rank's pid>.
"""

import json
import os
import socket
import sys

import numpy as np  # noqa: F401
import torch  # noqa: F401
from torch.utils.data import DataLoader

from tests.children.zarr_blocks import ZarrBlocks, matches_direct_read, record_armed_worker
from tests.zarrs_data import write_arrays

OUT, RUNS = sys.argv[1], sys.argv[2:]
PATH = write_arrays(OUT)["plain"]


def train_loop(config):
    if config["install"]:
        # Ray Train runs this function in its own worker processes: install() here.
        import safeloader

        safeloader.install()
        out = config["out"]
        safeloader.register_at_fork(after_in_child=lambda: record_armed_worker(out), name="test.ray_armed")
    import ray.train
    import ray.train.torch

    dataset = config["dataset"]
    dataset[0]  # the training process decodes first: zarrs' pool now exists here
    # torch's workers hang on their first item: seen after 5 s (armed ones get 20 s on a loaded machine)
    loader = DataLoader(dataset, batch_size=2, num_workers=2, timeout=20 if config["install"] else 5)
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    seen, correct = [], True
    for indices, blocks in loader:
        correct &= matches_direct_read(indices.tolist(), blocks)
        seen += indices.tolist()
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"rank-{rank}.json"), "w") as f:
        report = {"rank": rank, "pid": os.getpid(), "seen": seen, "correct": correct}
        report |= {"type": type(loader).__qualname__, "sampler": type(loader.sampler).__qualname__}
        json.dump(report, f)


import ray  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

# CI runs two suites side by side, each with its own Ray cluster. Ray Train's helper actors look
# for "the" local cluster when no address is set, find both and fail ("Found multiple active Ray
# instances"): this run's cluster gets a port chosen here, and every worker of the job its address.
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    gcs_port = probe.getsockname()[1]
os.environ["RAY_GCS_SERVER_PORT"] = str(gcs_port)
ray.init(
    num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
    runtime_env={"env_vars": {"RAY_ADDRESS": f"127.0.0.1:{gcs_port}"}},
)
try:
    dataset = ZarrBlocks(PATH)
    dataset[0]  # the driver reads too, as users check their data
    for run in RUNS:
        out = os.path.join(OUT, run)
        os.makedirs(out)
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"dataset": dataset, "install": run == "install", "out": out},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=os.path.join(OUT, "ray"), name=run),
        )
        try:
            trainer.fit()
        except Exception as error:  # Ray Train's error carries the rank's traceback
            print(f"@@{run} failed: {error!r}", flush=True)
        else:
            print(f"@@{run} ok", flush=True)
finally:
    ray.shutdown()
