"""Loaders rebuilt by trainers stay safeloader loaders, or stay armed after install().

- Lightning rebuilds a DataLoader from its attributes (``_update_dataloader``)
  with the class of the original: a ``SafeDataLoader`` comes back as one, with
  the same arguments, safeloader's own keywords included. No ``install()`` needed.
- Ray Train (``prepare_data_loader``) and HF Accelerate (``prepare_data_loader``)
  build a new loader from torch's class, through a name they imported from
  ``torch.utils.data`` at import time: the subclass is lost, and only
  ``install()`` arms its workers. ``rebuild_as_plain_torch_loader`` below does
  what they do.
- A loader and its Dataset pickle exactly where torch's do.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import pickle
import sys

import numpy as np
import pytest
import torch
import zarr
from torch.utils.data import DataLoader as TorchDataLoader  # imported before any install(), as trainers do
from torch.utils.data import Dataset, DistributedSampler

import safeloader
from safeloader import SafeDataLoader

from .subproc import run_script

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(90)]

# lightning (in the test extra) is imported by the tests that use it, not at collection: with what
# it imports (scipy, sympy, matplotlib, torchmetrics) it costs about 5 CPU-seconds and 200,000
# objects, which every test process of the suite imported, and every full collection there walked.
FABRIC_DATA = "lightning.fabric.utilities.data"
PYTORCH_DATA = "lightning.pytorch.utilities.data"


class Numbered(Dataset):
    """Item i is (i, pid of the process that read it)."""

    def __init__(self, length: int = 24) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return index, os.getpid()


def seed_numpy(worker_id: int) -> None:
    np.random.seed(worker_id)


def collate_pairs(batch):
    return torch.utils.data.default_collate(batch)


class ArmedWorkers:
    """An after_in_child hook that appends the worker's pid to a file: which forks were armed."""

    def __init__(self, tmp_path) -> None:
        self.path = str(tmp_path / f"armed-{os.urandom(4).hex()}")
        safeloader.register_at_fork(after_in_child=self._record, name="test.trainers_armed", replace=True)

    def _record(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()} {safeloader.fork_context().worker_id}\n")

    def pids(self) -> dict[int, int]:
        """worker pid -> worker id."""
        if not os.path.exists(self.path):
            return {}
        with open(self.path) as f:
            return {int(pid): int(worker) for pid, worker in (line.split() for line in f)}


# Every SafeDataLoader argument but those a new sampler replaces, set to a non-default value.
SAFE_KEYWORDS = {
    "zarrs_mode": "serial",
    "thread_budget": 1,
    "freeze_gc": True,
    "stall_timeout": 45.0,
    "disable_hooks": ("pin_memory",),  # a real hook (unknown names are refused); no pinning here
}


def full_loader(dataset: Dataset) -> SafeDataLoader:
    return SafeDataLoader(
        dataset,
        batch_size=3,
        shuffle=True,
        num_workers=2,
        collate_fn=collate_pairs,
        pin_memory=False,
        drop_last=True,
        timeout=30,
        worker_init_fn=seed_numpy,
        multiprocessing_context="fork",
        generator=torch.Generator().manual_seed(3),
        prefetch_factor=3,
        persistent_workers=True,
        in_order=False,
        **SAFE_KEYWORDS,
    )


def init_arguments(loader) -> dict[str, object]:
    """The loader's init arguments as it stores them, minus those a sampler replaces."""
    names = [
        name
        for name, p in inspect.signature(SafeDataLoader.__init__).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"
    ]
    names += ["prefetch_factor", "persistent_workers", "in_order", "pin_memory_device"]
    replaced = {"sampler", "batch_sampler", "shuffle"}
    values = {name: getattr(loader, name) for name in names if name not in replaced}
    context = values["multiprocessing_context"]
    values["multiprocessing_context"] = None if context is None else context.get_start_method()
    return values


@pytest.mark.parametrize("module", [PYTORCH_DATA, FABRIC_DATA], ids=["lightning.pytorch", "lightning.fabric"])
@pytest.mark.parametrize("built_in_hook", [False, True], ids=["plain", "built-in-*_dataloader-hook"])
def test_lightning_rebuild_with_distributed_sampler_returns_equal_safe_loader(module, built_in_hook):
    module = importlib.import_module(module)
    fabric_data = importlib.import_module(FABRIC_DATA)
    dataset = Numbered()
    if built_in_hook:
        # Lightning records the init arguments of loaders built inside its
        # *_dataloader hooks, and rebuilds from those.
        with fabric_data._replace_dunder_methods(TorchDataLoader, "dataset"):
            loader = full_loader(dataset)
        assert hasattr(loader, "__pl_saved_args")
    else:
        loader = full_loader(dataset)
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=5)

    rebuilt = module._update_dataloader(loader, sampler)

    assert type(rebuilt) is SafeDataLoader
    assert rebuilt is not loader
    assert rebuilt.sampler is sampler and rebuilt.batch_sampler.sampler is sampler
    assert init_arguments(rebuilt) == init_arguments(loader)
    for name, value in SAFE_KEYWORDS.items():
        assert getattr(rebuilt, name) == value


def test_lightning_rebuilt_loader_is_armed_and_reads_its_shard(tmp_path):
    dataset = Numbered()
    armed = ArmedWorkers(tmp_path)
    loader = SafeDataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, zarrs_mode="serial")
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=11)

    rebuilt = importlib.import_module(PYTORCH_DATA)._update_dataloader(loader, sampler)
    seen, readers = [], set()
    for indices, pids in rebuilt:
        seen += indices.tolist()
        readers |= set(pids.tolist())

    assert seen == list(sampler)  # torch's DistributedSampler order, value for value
    assert readers == set(armed.pids()) and sorted(armed.pids().values()) == [0, 1]


@functools.cache
def tiny_regression() -> type:
    """The LightningModule class below (defined on first use: see FABRIC_DATA)."""
    import lightning

    class TinyRegression(lightning.LightningModule):
        """A one-layer model that records which dataset indices it trained on."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[int] = []
            self.reader_pids: set[int] = set()

        def training_step(self, batch, batch_index):
            indices, pids = batch
            self.seen += indices.tolist()
            self.reader_pids |= set(pids.tolist())
            x = indices.float().unsqueeze(1)
            return torch.nn.functional.mse_loss(self.layer(x), 2 * x)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    return TinyRegression


def quiet_trainer(**kwargs):
    import lightning

    return lightning.Trainer(
        accelerator="cpu",
        max_epochs=1,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_lightning_fit_runs_one_epoch_on_armed_workers(tmp_path):
    armed = ArmedWorkers(tmp_path)
    model = tiny_regression()()
    loader = SafeDataLoader(Numbered(16), batch_size=4, shuffle=True, num_workers=2, zarrs_mode="serial")
    trainer = quiet_trainer(devices=1, default_root_dir=str(tmp_path))

    trainer.fit(model, train_dataloaders=loader)

    assert trainer.state.finished and trainer.current_epoch == 1
    assert type(trainer.train_dataloader) is SafeDataLoader
    assert sorted(model.seen) == list(range(16))  # one epoch, every item once
    assert model.reader_pids == set(armed.pids()) and sorted(armed.pids().values()) == [0, 1]


@pytest.mark.timeout(150)
def test_lightning_ddp_on_cpu_rebuilds_safe_loaders_with_distributed_sampler(tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # Lightning's DDP launcher re-runs sys.argv for the other rank: the child is a script file.
    env = {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    result = run_script("lightning_ddp.py", out_dir, timeout=140, env=env)
    assert not result.timed_out and result.returncode == 0, f"Lightning DDP fit failed:\n{result}"

    reports = [json.loads((out_dir / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert sorted(i for r in reports for i in r["seen"]) == list(range(16))  # disjoint and complete
    for report in reports:
        assert report["finished"]
        # Lightning re-instantiated our loader with its DistributedSampler: still ours, same options.
        assert report["type"] == "SafeDataLoader" and report["sampler"] == "DistributedSampler"
        assert report["options"] == ["serial", 1] and report["num_workers"] == 2
        armed = {int(pid) for pid in (out_dir / f"armed-{report['rank']}").read_text().split()}
        assert len(armed) == 2 and set(report["reader_pids"]) == armed and report["pid"] not in armed


def rebuild_as_plain_torch_loader(loader, sampler):
    """What Ray Train's and HF Accelerate's prepare_data_loader do: a new loader
    from torch's class (the name this module imported before install()),
    carrying over torch's arguments only; the subclass is lost."""
    return TorchDataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        shuffle=False,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=loader.generator,
    )


def test_loader_rebuilt_as_plain_torch_loader_is_armed_only_after_install(tmp_path):
    dataset = Numbered()
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=2)
    reference = [i for indices, _ in TorchDataLoader(dataset, batch_size=4, sampler=sampler) for i in indices.tolist()]

    def read(rebuilt) -> tuple[list[int], set[int]]:
        seen, readers = [], set()
        for indices, pids in rebuilt:
            seen += indices.tolist()
            readers |= set(pids.tolist())
        return seen, readers

    original = SafeDataLoader(dataset, batch_size=4, shuffle=True, num_workers=2)
    not_installed = ArmedWorkers(tmp_path)
    rebuilt = rebuild_as_plain_torch_loader(original, sampler)
    assert type(rebuilt) is TorchDataLoader  # the subclass is lost
    assert read(rebuilt)[0] == reference
    assert not_installed.pids() == {}  # the failure install() fixes: these workers were not armed

    with safeloader.install():
        installed = ArmedWorkers(tmp_path)
        rebuilt = rebuild_as_plain_torch_loader(original, sampler)
        assert type(rebuilt) is TorchDataLoader  # torch's class, built from the early name
        seen, readers = read(rebuilt)
    assert seen == reference
    assert readers == set(installed.pids()) and sorted(installed.pids().values()) == [0, 1]


@pytest.mark.parametrize("case", ["workers", "persistent", "lambda-init"])
def test_plain_torch_loader_pickles_after_install_as_without(tmp_path, case):
    # install() rebinds torch's DataLoader names; pickle finds classes by name.
    kwargs = LOADER_CASES[case]
    dataset = [float(i) for i in range(8)]
    reference = TorchDataLoader(dataset, batch_size=2, **kwargs)
    plain = TorchDataLoader(dataset, batch_size=2, **kwargs)  # before install, as a trainer's module does
    loaders = [reference, plain]
    try:
        expected = [pickles(reference), list(reference) and pickles(reference)]  # fresh, after an epoch
        with safeloader.install():
            rebuilt_after_install = TorchDataLoader(dataset, batch_size=2, **kwargs)  # the early-imported name
            loaders.append(rebuilt_after_install)
            armed = ArmedWorkers(tmp_path)
            for epoch in range(2):
                assert pickles(plain) == expected[epoch] == pickles(rebuilt_after_install)
                if expected[epoch][0] and epoch == 0:
                    copy = pickle.loads(pickle.dumps(rebuilt_after_install))
                    assert type(copy) is TorchDataLoader
                    assert torch.cat(list(copy)).tolist() == dataset
                    assert sorted(armed.pids().values()) == [0, 1]  # the copy is armed too
                list(plain), list(rebuilt_after_install)
    finally:
        for loader in loaders:
            if loader._iterator is not None:  # persistent workers live as long as their loader
                loader._iterator._shutdown_workers()
    assert "__reduce_ex__" not in TorchDataLoader.__dict__  # uninstall restored torch's class


class ZarrRows(Dataset):
    """A Dataset holding an open zarr array, as users write them."""

    def __init__(self, path: str) -> None:
        self.array = zarr.open_array(path, mode="r")

    def __len__(self) -> int:
        return self.array.shape[0]

    def __getitem__(self, index: int):
        return torch.from_numpy(self.array[index])


def pickles(obj) -> tuple[bool, str]:
    try:
        return True, type(pickle.loads(pickle.dumps(obj))).__qualname__
    except Exception as exc:  # the outcome is what we compare
        return False, type(exc).__name__


LOADER_CASES = {
    "workers": dict(num_workers=2),
    "spawn-context": dict(num_workers=1, multiprocessing_context="spawn"),
    "generator": dict(num_workers=2, generator=torch.Generator().manual_seed(1)),
    "persistent": dict(num_workers=2, persistent_workers=True),  # torch: not once iterated
    "lambda-init": dict(num_workers=2, worker_init_fn=lambda worker_id: None),  # torch: never
}


# Spawned workers import torch: on a loaded machine (CI runs two legs side by side) the
# spawn case's five loader starts take over a minute.
@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", LOADER_CASES)
def test_loader_pickles_where_torch_does(case):
    kwargs = LOADER_CASES[case]
    dataset = [float(i) for i in range(8)]  # a plain list: spawned workers need not import this module
    torch_loader = TorchDataLoader(dataset, batch_size=2, **kwargs)
    safe_loader = SafeDataLoader(dataset, batch_size=2, zarrs_mode="serial", **kwargs)
    for epoch in range(2):  # fresh, then after an epoch
        torch_outcome, safe_outcome = pickles(torch_loader), pickles(safe_loader)
        assert safe_outcome[0] == torch_outcome[0]
        assert safe_outcome[1] == ("SafeDataLoader" if torch_outcome[0] else torch_outcome[1])
        if safe_outcome[0] and epoch == 0:
            copy = pickle.loads(pickle.dumps(safe_loader))
            assert copy.zarrs_mode == "serial" and copy.num_workers == safe_loader.num_workers
            assert torch.cat(list(copy)).tolist() == dataset
        if epoch == 0:
            list(torch_loader), list(safe_loader)  # (each spawn start costs a torch import)
    for loader in (torch_loader, safe_loader):
        if loader._iterator is not None:  # persistent workers live as long as their loader
            loader._iterator._shutdown_workers()


def test_zarr_dataset_pickles_after_armed_workers_read_it(tmp_path):
    path = str(tmp_path / "rows.zarr")
    data = np.arange(8 * 16, dtype="float32").reshape(8, 16)
    zarr.create_array(path, shape=data.shape, shards=(1, 16), chunks=(1, 4), dtype="float32")[:] = data
    with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
        dataset = ZarrRows(path)
        assert pickles(dataset) == (True, "ZarrRows")  # as under torch: nothing of ours attached yet
        dataset[0]  # the parent reads first
        loader = SafeDataLoader(dataset, batch_size=4, num_workers=2, zarrs_mode="serial", timeout=30)
        assert np.array_equal(torch.cat(list(loader)).numpy(), data)
        copy = pickle.loads(pickle.dumps(dataset))
        assert np.array_equal(np.stack([copy[i].numpy() for i in range(8)]), data)
        loader_copy = pickle.loads(pickle.dumps(loader))
        assert np.array_equal(torch.cat(list(loader_copy)).numpy(), data)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
