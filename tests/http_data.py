"""Datasets reading an HTTP server (benchmarks.http_server) through clients made in __init__,
for test_fsspec, test_sockets and their child processes."""

from __future__ import annotations

import http.client
import ssl
from pathlib import Path

import fsspec
import numpy as np
import requests
import urllib3
from torch.utils.data import Dataset

from benchmarks.http_server import COUNT, RECORD, Server

# A self-signed certificate and key for 127.0.0.1 (valid until 2126), for the TLS server.
CERTIFICATE = str(Path(__file__).resolve().parent / "data" / "localhost.pem")


class HttpFsRecords(Dataset):
    """Item i: ``/r/i`` through an fsspec HTTP filesystem, or record i of ``/blob`` through
    a file object, both made here and used by the parent first."""

    def __init__(self, base: str, through: str) -> None:
        self.base, self.through = base, through
        self.fs = fsspec.filesystem("http")
        if through == "file":
            self.file = self.fs.open(base + "/blob", "rb", block_size=4 * RECORD)
        self[0]

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, i: int):
        if self.through == "file":
            self.file.seek(i * RECORD)
            body = self.file.read(RECORD)
        else:
            body = self.fs.cat(f"{self.base}/r/{i}")
        return i, np.frombuffer(body, np.uint8).copy()


def http_fs_case(through: str) -> tuple[HttpFsRecords, np.ndarray]:
    """For ``assert_torch_loader_fails``: a server (left running) and HttpFsRecords reading it."""
    server = Server(lifetime=100).start()
    return HttpFsRecords(server.base, through), server.data


class HttpRecords(Dataset):
    """Item i: ``/r/i`` fetched through one keep-alive client made here, used once by the parent."""

    def __init__(self, base: str, client: str) -> None:
        self.base, self.client = base, client.removesuffix(" over TLS")
        if self.client == "requests":
            self.session = requests.Session()
        elif self.client == "urllib3":
            self.pool = urllib3.PoolManager(maxsize=1)
        else:
            host, port = base.split("://")[1].split(":")
            if base.startswith("https"):
                context = ssl.create_default_context(cafile=CERTIFICATE)
                self.connection = http.client.HTTPSConnection(host, int(port), timeout=10, context=context)
            else:
                self.connection = http.client.HTTPConnection(host, int(port), timeout=10)
        self[0]  # the parent uses the connection first: it stays open (keep-alive)

    def fetch(self, path: str) -> bytes:
        if self.client == "requests":
            # verify per request: a REQUESTS_CA_BUNDLE in the environment overrides Session.verify
            return self.session.get(self.base + path, timeout=10, verify=CERTIFICATE).content
        if self.client == "urllib3":
            return self.pool.request("GET", self.base + path, timeout=10).data
        self.connection.request("GET", path)
        return self.connection.getresponse().read()

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, i: int):
        body = self.fetch(f"/r/{i}")
        if len(body) != RECORD:  # another record's or response's bytes: count it as wrong
            body = (body + bytes(RECORD))[:RECORD]
        return i, np.frombuffer(body, np.uint8).copy()


def http_case(client: str) -> tuple[HttpRecords, np.ndarray]:
    """For ``assert_torch_loader_fails``: a server (TLS for a client "... over TLS", left running)
    and HttpRecords reading it through ``client``."""
    server = Server(certificate=CERTIFICATE if client.endswith("TLS") else None).start()
    return HttpRecords(server.base, client), server.data
