"""LMDB environments opened in a Dataset's __init__ work in forked workers for a whole epoch."""

from __future__ import annotations

from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, Dataset

from safeloader import DataLoader, get_options
from safeloader.backends.lmdb import LmdbWritableError

from .subproc import run_python

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(90)]

RECORD = 16
COUNT = 600  # items per epoch: far more read transactions per worker than LMDB's 126 reader slots
REPO = str(Path(__file__).resolve().parent.parent)


def write_env(path: Path, seed: int = 0) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 256, (COUNT, RECORD), dtype=np.uint8)
    with lmdb.open(str(path), map_size=1 << 24) as env, env.begin(write=True) as txn:
        for i, row in enumerate(data):
            txn.put(b"%d" % i, row.tobytes())
    return data


class LmdbRecords(Dataset):
    """Item i: key ``i``, read in a fresh read transaction of the environment opened here."""

    def __init__(self, path: str, readonly: bool = True) -> None:
        self.env = lmdb.open(path, readonly=readonly, lock=True)
        self[0]  # the parent reads first

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, i: int):
        with self.env.begin() as txn:
            return i, np.frombuffer(txn.get(b"%d" % i), np.uint8).copy()


def epoch(loader) -> tuple[np.ndarray, np.ndarray]:
    indices, values = zip(*[(i, v) for i, v in loader])
    return torch.cat(indices).numpy(), torch.cat(values).numpy()


def test_environment_opened_in_init_serves_a_whole_epoch_in_2_workers(tmp_path):
    data = write_env(tmp_path / "db")
    dataset = LmdbRecords(str(tmp_path / "db"))
    reference = epoch(DataLoader(dataset, batch_size=8, num_workers=0))
    for _ in range(2):  # two epochs, each far longer than the reader table
        indices, values = epoch(DataLoader(dataset, batch_size=8, num_workers=2, shuffle=True))
        assert sorted(indices.tolist()) == list(range(COUNT))
        assert (values == reference[1][indices]).all() and (values == data[indices]).all()
    assert dataset.env.path() == str(tmp_path / "db")  # the parent's own environment is untouched
    assert dataset[5][1].tolist() == data[5].tolist()


def test_environments_in_nested_datasets_and_containers_are_reopened(tmp_path):
    data = write_env(tmp_path / "db")
    inner = LmdbRecords(str(tmp_path / "db"))
    inner.shards = {"a": [inner.env]}  # a second reference, inside a dict of lists
    dataset = ConcatDataset([inner, inner])
    indices, values = epoch(DataLoader(dataset, batch_size=8, num_workers=2))
    assert (values == data[indices % COUNT]).all()


@pytest.mark.torch_baseline
@pytest.mark.timeout(120)
def test_same_environment_under_torch_loader_runs_out_of_reader_slots(tmp_path):
    write_env(tmp_path / "db")
    result = run_python(
        f"""
        import sys
        sys.path.insert(0, {REPO!r})
        import torch.utils.data
        from tests.test_lmdb import LmdbRecords, epoch
        dataset = LmdbRecords({str(tmp_path / "db")!r})
        try:
            epoch(torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2))
            print("RESULT ok")
        except Exception as exc:
            print("RESULT", type(exc).__name__, exc)
        """,
        timeout=90,
    )
    assert not result.timed_out, result
    assert "RESULT" in result.stdout and "MDB_READERS_FULL" in result.stdout, result


def test_writable_environment_is_refused_before_any_worker_starts(tmp_path):
    write_env(tmp_path / "db")
    dataset = LmdbRecords(str(tmp_path / "db"), readonly=False)
    with pytest.raises(LmdbWritableError, match=r"open for writing.*readonly=True"):
        next(iter(DataLoader(dataset, batch_size=8, num_workers=2)))
    dataset.env.close()


@pytest.mark.timeout(120)
def test_environment_is_reopened_in_spawn_workers_and_writable_ones_are_refused(tmp_path):
    data = write_env(tmp_path / "db")
    dataset = LmdbRecords(str(tmp_path / "db"))
    indices, values = epoch(DataLoader(dataset, batch_size=50, num_workers=1, multiprocessing_context="spawn"))
    assert (values == data[indices]).all()
    dataset.env.close()  # py-lmdb opens a path once per process
    writable = LmdbRecords(str(tmp_path / "db"), readonly=False)
    with pytest.raises(TypeError, match="writable LMDB environment"):
        from safeloader.backends import lmdb as lmdb_backend

        lmdb_backend.prepare_start(None, get_options(), "spawn")
        lmdb_backend.reduce_environment(writable.env)
    writable.env.close()
