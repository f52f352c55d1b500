"""LMDB environments and the Dataset over them that test_lmdb and its child processes read."""

from __future__ import annotations

from pathlib import Path

import lmdb
import numpy as np
import torch
from torch.utils.data import Dataset

RECORD = 16
COUNT = 600  # items per epoch: far more read transactions per worker than LMDB's 126 reader slots


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

