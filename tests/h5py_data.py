"""HDF5 files and the Datasets over them that test_h5py and its child processes read."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
from torch.utils.data import Dataset

from .helpers import COUNT, MEMBERS, RECORD


def write_h5(path: Path, count: int = COUNT, seed: int = 0) -> np.ndarray:
    """``/compressed``: chunked, gzip; ``/plain/contiguous``: contiguous; same records."""
    data = np.random.default_rng(seed).integers(0, 256, (count, RECORD), dtype=np.uint8)
    with h5py.File(path, "w") as f:
        f.create_dataset("compressed", data=data, chunks=(16, RECORD), compression="gzip", shuffle=True)
        f.create_group("plain").create_dataset("contiguous", data=data)
    return data


def open_h5(path: str, driver: str | None) -> h5py.File:
    if driver == "fileobj":
        return h5py.File(open(path, "rb"), "r")  # a Python file object
    return h5py.File(path, "r", driver=driver)


class H5Items(Dataset):
    """Item i: row i of a compressed and of a contiguous dataset, through objects made here."""

    def __init__(self, path: str, driver: str | None = None) -> None:
        self.file = open_h5(path, driver)
        self.compressed = self.file["compressed"]  # a Dataset object held across the fork
        self.group = self.file["plain"]  # a Group object held across the fork

    def __len__(self) -> int:
        return len(self.compressed)

    def __getitem__(self, i: int):
        return i, np.stack([self.compressed[i], self.group["contiguous"][i]])


def direct_h5(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return np.stack([f["compressed"][:], f["plain/contiguous"][:]], axis=1)



def h5_case(path: str, driver: str) -> tuple[H5Items, np.ndarray]:
    """For ``assert_torch_loader_fails``: H5Items over ``path`` with ``driver``, and its direct read."""
    return H5Items(path, driver), direct_h5(Path(path))


class Everything(Dataset):
    """Item i through each kind of handle opened in __init__: h5py File, Dataset and
    Group, an npz archive and a buffered file."""

    def __init__(self, h5: str, npz: str, records: str) -> None:
        self.file = h5py.File(h5, "r", rdcc_nbytes=2**20)
        self.compressed = self.file["compressed"]
        self.group = self.file["plain"]
        self.archive = np.load(npz)
        self.records = open(records, "rb")

    def __len__(self) -> int:
        return MEMBERS

    def __getitem__(self, i: int):
        self.records.seek(i * RECORD)
        record = np.frombuffer(self.records.read(RECORD), np.uint8)
        rows = [self.compressed[i], self.group["contiguous"][i], self.archive[f"m{i}"], record]
        return i, np.stack(rows)


