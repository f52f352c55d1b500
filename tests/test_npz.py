"""np.load(".npz") archives opened in a Dataset's __init__ read correctly in forked workers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import Dataset

from safeloader import DataLoader
from safeloader.backends import npz as npz_backend

from .test_files import (
    RECORD,
    assert_torch_loader_fails,
    check_random_reads,
    check_workers_and_parent,
    random_loader,
)

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(60)]

MEMBERS = 200


def write_archives(directory: Path, seed: int = 0) -> tuple[Path, Path, np.ndarray]:
    """The same ``MEMBERS`` arrays in a stored and in a deflate-compressed archive."""
    data = np.random.default_rng(seed).integers(0, 256, (MEMBERS, RECORD), dtype=np.uint8)
    members = {f"m{i}": row for i, row in enumerate(data)}
    plain, compressed = directory / "plain.npz", directory / "compressed.npz"
    np.savez(plain, **members)
    np.savez_compressed(compressed, **members)
    return plain, compressed, data


class Archives(Dataset):
    """Item i: member ``m{i}`` of both archives, opened here with np.load."""

    def __init__(self, plain: str, compressed: str) -> None:
        self.plain = np.load(plain)
        self.compressed = np.load(compressed)

    def __len__(self) -> int:
        return MEMBERS

    def __getitem__(self, i: int):
        return i, np.stack([self.plain[f"m{i}"], self.compressed[f"m{i}"]])


def direct_archives(plain: Path, compressed: Path) -> np.ndarray:
    """Expected values: a fresh np.load of each archive, read in this process."""
    with np.load(plain) as p, np.load(compressed) as c:
        return np.stack([np.stack([p[f"m{i}"], c[f"m{i}"]]) for i in range(MEMBERS)])


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
    setup = f"""
        from pathlib import Path
        from tests.test_npz import Archives, direct_archives
        dataset = Archives({str(plain)!r}, {str(compressed)!r})
        expected = direct_archives(Path({str(plain)!r}), Path({str(compressed)!r}))
    """
    assert_torch_loader_fails(setup)


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
