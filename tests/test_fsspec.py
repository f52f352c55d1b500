"""fsspec async filesystems (and HTTP files) created in a Dataset's __init__ work in forked workers."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest
from torch.utils.data import Dataset

from benchmarks.http_server import COUNT, RECORD, Server
from safeloader import DataLoader

from .test_files import assert_torch_loader_fails, check_workers_and_parent

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(90)]


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


@pytest.mark.parametrize("through", ["filesystem", "file"])
def test_http_filesystem_and_files_made_in_init_work_in_4_workers(through):
    with Server() as server:
        dataset = HttpFsRecords(server.base, through)
        loop = dataset.fs.loop
        check_workers_and_parent(dataset, server.data)
        assert dataset.fs.loop is loop  # the parent's filesystem kept its own loop and session


@pytest.mark.torch_baseline
@pytest.mark.timeout(150)
@pytest.mark.parametrize("through", ["filesystem", "file"])
def test_same_dataset_under_torch_loader_fails_or_hangs(through):
    setup = f"""
        from benchmarks.http_server import Server
        from tests.test_fsspec import HttpFsRecords
        server = Server(lifetime=100).start()
        dataset = HttpFsRecords(server.base, {through!r})
        expected = server.data
    """
    assert_torch_loader_fails(setup)


def test_filesystem_is_the_workers_cached_instance_after_rebuild():
    class Same(Dataset):
        def __init__(self) -> None:
            self.fs = fsspec.filesystem("http")

        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: int):
            return self.fs.loop is not None and fsspec.filesystem("http") is self.fs

    assert list(DataLoader(Same(), batch_size=None, num_workers=1)) == [True]


def test_stream_file_opened_in_parent_fails_at_once_with_a_clear_error():
    with Server() as server:
        fs = fsspec.filesystem("http")

        class Stream(Dataset):
            def __init__(self) -> None:
                self.file = fs.open(server.base + "/blob", "rb", block_size=0)

            def __len__(self) -> int:
                return 1

            def __getitem__(self, i: int):
                return self.file.read(RECORD)

        with pytest.raises(RuntimeError, match="opened in the parent process on fsspec's event loop"):
            list(DataLoader(Stream(), batch_size=None, num_workers=1, stall_timeout=20))
