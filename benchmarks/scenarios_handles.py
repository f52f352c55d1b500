"""Scenarios for handles a Dataset opens in __init__ beyond files: HTTP keep-alive, fsspec, LMDB.

Each contender's child process runs its own local HTTP server (127.0.0.1,
from ``benchmarks.http_server``) in a thread; the Dataset holds only its URL and
its client. "lazy per worker" is the usual workaround: the client or
environment is made on first use in each process (a pid check).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .contenders import Measure, Setup, epoch, loader_kinds


def write_lmdb(directory: Path, records: np.ndarray) -> str:
    import lmdb

    path = directory / "data.lmdb"
    with lmdb.open(str(path), map_size=1 << 28) as env, env.begin(write=True) as txn:
        for i, row in enumerate(records):
            txn.put(b"%d" % i, row.tobytes())
    return str(path)


class Handle(Dataset):
    """Item i (bytes as float64) through a handle of ``kind`` made in __init__ and used there
    once, or (``lazy``) made on first use in each process."""

    def __init__(self, kind: str, source: str, count: int, lazy: bool = False) -> None:
        self.kind, self.source, self.count, self.lazy = kind, source, count, lazy
        self.records = self.handle_records() if kind == "lmdb" else count
        self.handle, self.pid = self.open(), os.getpid()
        self[0]
        if lazy:
            self.handle, self.pid = None, None

    def handle_records(self) -> int:
        import lmdb

        with lmdb.open(self.source, readonly=True, lock=False) as env:
            return env.stat()["entries"]

    def open(self) -> Any:
        if self.kind == "requests":
            import requests

            return requests.Session()
        if self.kind == "fsspec":
            import fsspec

            return fsspec.filesystem("http", skip_instance_cache=self.lazy)
        import lmdb

        return lmdb.open(self.source, readonly=True, lock=True)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.lazy and self.pid != os.getpid():
            self.handle, self.pid = self.open(), os.getpid()
        if self.kind == "requests":
            body = self.handle.get(f"{self.source}/r/{index}", timeout=30).content
        elif self.kind == "fsspec":
            body = self.handle.cat(f"{self.source}/r/{index}")
        else:
            with self.handle.begin() as txn:
                body = txn.get(b"%d" % (index % self.records))
        return torch.from_numpy(np.frombuffer(body, np.uint8).astype(np.float64))


def handle_contender(kind: str, loader_kind: str, lazy: bool = False) -> Setup:
    def setup(params: dict) -> Measure:
        if kind == "lmdb":
            # A copy per contender: the slots torch's workers leak in the reader table
            # (a file shared by every process opening the database) would fill it for all.
            import shutil
            import tempfile

            source = shutil.copytree(params["lmdb"], tempfile.mkdtemp(prefix="lmdb-", dir=params["dir"]) + "/db")
            # Each record read 10 times per epoch: reads, not worker start-up, dominate.
            count, checksum = 10 * params["file_items"], 10 * params["file_checksum"]
        else:
            from .http_server import COUNT, Server

            server = Server(lifetime=3600).start()
            source, count, checksum = server.base, COUNT, float(server.data.sum(dtype=np.int64))
        dataset = Handle(kind, source, count, lazy=lazy)
        build = loader_kinds()[loader_kind]
        generator = torch.Generator().manual_seed(0)
        return lambda: epoch(build, dataset, checksum, batch_size=16, num_workers=2, shuffle=True, generator=generator)

    return setup


def table() -> dict[str, dict[str, Setup]]:
    labels = {"requests": "HTTP keep-alive (requests.Session)", "fsspec": "fsspec HTTP filesystem",
              "lmdb": "LMDB read-only environment"}
    return {
        f"{label} made in __init__": {
            **{loader: handle_contender(kind, loader) for loader in ("torch fork", "spawn", "forkserver+preload")},
            "lazy per worker, fork": handle_contender(kind, "torch fork", lazy=True),
            "safeloader": handle_contender(kind, "safeloader"),
        }
        for kind, label in labels.items()
    }
