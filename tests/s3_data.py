"""A Dataset reading a local S3 service (moto, 127.0.0.1 only) through an s3fs filesystem made
in __init__, for test_fsspec and its torch child process."""

from __future__ import annotations

import os

import numpy as np
import s3fs
from moto.server import ThreadedMotoServer
from torch.utils.data import Dataset

COUNT, RECORD = 64, 64
BUCKET = "safeloader-test"
CREDENTIALS = {"key": "testing", "secret": "testing"}


class S3Service:
    """moto's S3 on a free port of 127.0.0.1, holding ``COUNT`` objects of ``RECORD`` random
    bytes (``data``); stopped on leaving the ``with`` block (a child process just exits)."""

    def __init__(self) -> None:
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.data = np.random.default_rng(5).integers(0, 256, (COUNT, RECORD), dtype=np.uint8)

    def start(self) -> S3Service:
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        fs = s3fs.S3FileSystem(endpoint_url=self.endpoint, skip_instance_cache=True, **CREDENTIALS)
        fs.mkdir(BUCKET)
        fs.pipe({f"{BUCKET}/r/{i}": row.tobytes() for i, row in enumerate(self.data)})
        return self

    def __enter__(self) -> S3Service:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


class S3Records(Dataset):
    """Item i: object ``r/i`` through an s3fs filesystem made here and used by the parent first
    (its session and event loop live in the parent)."""

    def __init__(self, endpoint: str) -> None:
        self.fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True, **CREDENTIALS)
        self[0]

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, i: int):
        return i, np.frombuffer(self.fs.cat(f"{BUCKET}/r/{i}"), np.uint8).copy()


def s3_case() -> tuple[S3Records, np.ndarray]:
    """For ``assert_torch_loader_fails``: a local S3 service (left running) and S3Records reading it."""
    service = S3Service().start()
    return S3Records(service.endpoint), service.data
