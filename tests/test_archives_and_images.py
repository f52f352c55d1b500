"""gzip, bz2, tar, zip and Pillow images opened in a Dataset's __init__ read correctly in workers.

None of these needs a backend of its own: the "files" hook gives each worker
its own file offset. Under torch's loader each fails (errors, or silently
wrong items), which these tests show in a fresh interpreter.
"""

from __future__ import annotations

import pytest

from .archives_data import ARCHIVES, IMAGE_KINDS, Opened, expected, records, write
from .helpers import SHARED_OFFSET, assert_torch_loader_fails, check_workers_and_parent

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(90)]


@pytest.mark.parametrize("kind", ARCHIVES + IMAGE_KINDS)
def test_opened_in_init_reads_correctly_in_4_workers(tmp_path, kind):
    path = write(kind, tmp_path)
    want = expected(kind, path)
    if kind in ARCHIVES:
        assert (want == records()).all()
    check_workers_and_parent(Opened(kind, path), want)


@pytest.mark.torch_baseline
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ARCHIVES + IMAGE_KINDS)
def test_same_dataset_under_torch_loader_fails(tmp_path, kind):
    path = write(kind, tmp_path)
    assert_torch_loader_fails("tests.archives_data:opened_case", kind, path, expect=SHARED_OFFSET)
