"""fsspec async filesystems (and HTTP files) created in a Dataset's __init__ work in forked workers."""

from __future__ import annotations

import fsspec
import pytest
from torch.utils.data import Dataset

from benchmarks.http_server import RECORD, Server
from safeloader import DataLoader

from .helpers import FAILURES, assert_torch_loader_fails, check_workers_and_parent
from .http_data import HttpFsRecords

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(90)]



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
    # The filesystem object: its event loop is the parent's (an error). A file opened through it: its
    # keep-alive connection is shared, a race that a run may show as a hang (seen), wrong data or an error.
    expect = "error" if through == "filesystem" else FAILURES
    assert_torch_loader_fails("tests.http_data:http_fs_case", through, expect=expect)


def test_s3_filesystem_made_in_init_works_in_4_workers():
    # s3fs (aiobotocore) on a local S3 service: the same rebuild as the HTTP filesystem,
    # with its own client session and credentials in each worker. Imported here: moto's server and
    # s3fs cost about 0.8 CPU-seconds, at collection in every test process.
    from .s3_data import S3Records, S3Service

    with S3Service() as service:
        dataset = S3Records(service.endpoint)
        loop = dataset.fs.loop
        check_workers_and_parent(dataset, service.data)
        assert dataset.fs.loop is loop


@pytest.mark.torch_baseline
@pytest.mark.timeout(150)
def test_same_s3_dataset_under_torch_loader_fails():
    assert_torch_loader_fails("tests.s3_data:s3_case", expect="error")


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
