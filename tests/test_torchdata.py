"""torchdata's StatefulDataLoader with safeloader.install(): imported before or after it, it loads
a zarrs Dataset whose parent decoded first, and resumes mid-epoch from ``state_dict()``.

StatefulDataLoader is ``class StatefulDataLoader(DataLoader[_T_co])`` with its own
``_get_iterator`` and worker loop: imported after ``install()`` it subclasses
SafeDataLoader (which must be generic for the import to work), and its worker
forks are recognised by install() through torchdata's ``_worker_loop``. Each
program runs in a fresh interpreter, since the import order is the point.
"""

from __future__ import annotations

import pytest

from .subproc import check_script, run_script
from .zarrs_data import write_arrays

pytestmark = pytest.mark.timeout(120)

@pytest.fixture(scope="module")
def plain_array(tmp_path_factory) -> str:
    return write_arrays(tmp_path_factory.mktemp("torchdata"))["plain"]


@pytest.mark.torch_baseline
def test_stateful_dataloader_hangs_without_safeloader(plain_array):
    result = run_script("stateful_loader.py", "torch only", plain_array, timeout=20, expect_hang=True)
    assert result.timed_out, f"torchdata's loader was expected to hang after the parent decoded:\n{result}"
    assert "iterating" in result.stdout


@pytest.mark.parametrize("order", ["install, then import torchdata", "import torchdata, then install"])
def test_stateful_dataloader_loads_and_resumes_mid_epoch_under_install(plain_array, order):
    result = check_script("stateful_loader.py", order, plain_array, timeout=90)
    assert "resumed with the same remaining batches" in result.stdout
