"""LMDB environments opened in a Dataset's __init__ work in forked workers for a whole epoch."""

from __future__ import annotations

import pytest
from torch.utils.data import ConcatDataset

from safeloader import DataLoader, get_options
from safeloader.backends.lmdb import LmdbWritableError

from .lmdb_data import COUNT, LmdbRecords, epoch, write_env
from .subproc import run_script

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(90)]

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
    result = run_script("lmdb_under_torch.py", tmp_path / "db", timeout=90)
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

        lmdb_backend.BACKEND.prepare_start(None, get_options(), "spawn")
        lmdb_backend.reduce_environment(writable.env)
    writable.env.close()
