"""``python -m safeloader demo``: run in a child process; its table must show safeloader correct."""

from __future__ import annotations

import pytest

from .subproc import run_python

FORMATS = ("zarr array, zstd, read through zarrs", "HDF5 file, gzip chunks (h5py)", "npz archive (np.load)")


@pytest.mark.timeout(180)
def test_demo_table_shows_safeloader_correct_for_every_format():
    result = run_python(
        "import sys; from safeloader.__main__ import main; sys.exit(main(['demo', '--torch-deadline', '8']))",
        timeout=170,
    )
    assert not result.timed_out and result.returncode == 0, str(result)
    out = result.stdout
    progress = [line for line in out.splitlines() if line.startswith("[")]
    assert len(progress) == 6, out  # progress is printed while it runs
    for fmt in FORMATS:
        ours = next(line for line in progress if fmt in line and "with safeloader.DataLoader" in line)
        assert "correct (32/32 items match)" in ours, out
        row = next(line for line in out.splitlines() if line.startswith(fmt))
        assert row.count("correct (32/32 items match)") >= 1, out
    # What torch does with the same Datasets is shown too: the zarrs one hangs and is killed.
    torch_zarr = next(line for line in progress if FORMATS[0] in line and "torch.utils.data.DataLoader" in line)
    assert "HUNG, killed after 8 s" in torch_zarr, out
    assert "safeloader returned correct data for every format" in out, out
