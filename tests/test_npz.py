"""np.load(".npz") archives opened in a Dataset's __init__ read correctly in forked workers."""

from __future__ import annotations

import numpy as np
import pytest

from safeloader import DataLoader
from safeloader.backends import npz as npz_backend

from .helpers import (
    SHARED_OFFSET,
    Archives,
    assert_torch_loader_fails,
    check_random_reads,
    check_workers_and_parent,
    direct_archives,
    random_loader,
    write_archives,
)

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(60)]

def test_npz_plain_and_compressed_read_correctly_in_4_workers(tmp_path):
    plain, compressed, data = write_archives(tmp_path)
    dataset = Archives(str(plain), str(compressed))
    expected = direct_archives(plain, compressed)
    assert (expected[:, 0] == data).all() and (expected[:, 1] == data).all()
    check_workers_and_parent(dataset, expected)


@pytest.mark.torch_baseline
@pytest.mark.timeout(90)
def test_same_npz_dataset_under_torch_loader_fails(tmp_path):
    plain, compressed, _ = write_archives(tmp_path)
    assert_torch_loader_fails("tests.helpers:archives_case", str(plain), str(compressed), expect=SHARED_OFFSET)


def test_npz_from_a_file_object_and_deleted_archive(tmp_path):
    plain, compressed, _ = write_archives(tmp_path)
    dataset = Archives(str(plain), str(compressed))
    dataset.plain = np.load(open(plain, "rb"))  # np.load of a file object: NpzFile does not own it
    expected = direct_archives(plain, compressed)
    plain.unlink()
    compressed.rename(tmp_path / "moved.npz")
    check_random_reads(random_loader(DataLoader, dataset), expected, seconds=0.5)


def test_npz_reduction_reopens_by_path_and_refuses_a_replaced_archive(tmp_path):
    plain, compressed, data = write_archives(tmp_path)
    with np.load(compressed, allow_pickle=False) as archive:
        function, args = npz_backend.reduce_npz(archive)
    reopened = function(*args)
    assert (reopened["m7"] == data[7]).all() and reopened.allow_pickle is False
    reopened.close()
    compressed.unlink()
    stand_in = function(*args)
    with pytest.raises(FileNotFoundError, match=f"could not reopen npz archive '{compressed}'"):
        stand_in["m7"]
    with np.load(plain) as archive:
        archive.close()
        with pytest.raises(TypeError, match="closed NpzFile"):
            npz_backend.reduce_npz(archive)
