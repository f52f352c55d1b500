"""``python -m safeloader demo``: run in a child process; its table must show safeloader correct."""

from __future__ import annotations

import pathlib
import re
import shutil
import tempfile

import pytest

from safeloader.demo import describe_error, shorten

from .subproc import run_python

FORMATS = ("zarr array, zstd, read through zarrs", "HDF5 file via a file object (h5py)", "npz archive (np.load)")


@pytest.fixture
def short_tmp():
    """An empty folder with a short path, for a run's TMPDIR (its Unix sockets' paths must fit in 107 bytes)."""
    folder = tempfile.mkdtemp(prefix="d")
    yield pathlib.Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def demo_folder(out: str, tmpdir) -> str:
    """The data folder the demo said it wrote to: inside the TMPDIR it was given."""
    folder = re.search(r" to (\S+) \.\.\.$", out, re.MULTILINE)
    assert folder is not None and folder.group(1).startswith(f"{tmpdir}/sl-demo-"), out
    return folder.group(1)


@pytest.mark.tooling
@pytest.mark.timeout(180)
def test_demo_table_shows_safeloader_correct_for_every_format_and_leaves_no_file(short_tmp):
    tmpdir = short_tmp
    result = run_python(
        "import sys; from safeloader.__main__ import main; sys.exit(main(['demo', '--torch-deadline', '8']))",
        timeout=170,
        env={"TMPDIR": str(tmpdir)},
    )
    assert not result.timed_out and result.returncode == 0, str(result)
    out = result.stdout
    demo_folder(out, tmpdir)
    # The data, and what the killed torch run left (multiprocessing's pymp-* folder), are removed.
    assert list(tmpdir.iterdir()) == [], out
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
    # The HDF5 file read through a file object: torch's workers share its offset (errors, wrong data
    # or, some runs, a worker that never answers).
    torch_hdf5 = next(line for line in progress if FORMATS[1] in line and "torch.utils.data.DataLoader" in line)
    assert any(shown in torch_hdf5 for shown in ("FAILED: ", "WRONG DATA", "HUNG, killed after 8 s")), out
    assert "safeloader returned correct data for every format" in out, out
    # A failure shows the worker's own exception (type and message), never torch's wrapper line cut short.
    assert "Caught " not in out and "in DataLoader worker" not in out, out
    for line in out.splitlines():
        if "FAILED: " in line:
            assert re.search(r"FAILED: [A-Za-z_]\w*(: |\s|$)", line), line


# A plain `pip install torch-safeloader` has neither zarr, zarrs nor h5py: they cannot be imported.
WITHOUT_EXTRAS = """
import sys
for module in ("zarr", "zarrs", "h5py"):
    sys.modules[module] = None  # import raises ModuleNotFoundError, as where it is not installed
from safeloader.__main__ import main
sys.exit(main(["demo"]))
"""


@pytest.mark.timeout(120)
def test_the_demo_without_extras_runs_the_npz_row_and_names_the_extras_for_the_others(short_tmp):
    tmpdir = short_tmp
    result = run_python(WITHOUT_EXTRAS, timeout=110, env={"TMPDIR": str(tmpdir)})
    assert not result.timed_out and result.returncode == 0, str(result)
    assert "Traceback" not in result.stderr, str(result)
    out = result.stdout
    assert "Skipping the zarr array, zstd, read through zarrs row: zarr, zarrs not installed" in out, out
    assert "pip install 'torch-safeloader[h5py]' installs it" in out, out
    progress = [line for line in out.splitlines() if line.startswith("[")]
    assert [line.split(" with ")[0] for line in progress] == [f"[{n}/2] npz archive (np.load)" for n in (1, 2)], out
    assert "correct (32/32 items match)" in progress[1], out
    skipped_row = r"^HDF5 file via a file object \(h5py\) +not run: pip install 'torch-safeloader\[h5py\]'$"
    assert re.search(skipped_row, out, re.MULTILINE), out
    assert "safeloader returned correct data for every format it ran" in out, out
    assert "To run the other rows too: pip install 'torch-safeloader[zarr,h5py]'" in out, out
    demo_folder(out, tmpdir)
    assert list(tmpdir.iterdir()) == [], out


def test_demo_help_describes_it_and_states_the_default_deadline(capsys, monkeypatch):
    from safeloader.__main__ import main

    monkeypatch.setenv("COLUMNS", "200")  # one line per option's help
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "with torch's DataLoader and with safeloader's" in shown, shown
    assert "Formats whose libraries are not installed are skipped, naming the extra to install" in shown, shown
    assert "counts as hung and is killed (default: 15)" in shown, shown


# What a worker raised, as torch re-raises it in the parent (the demo's children do the same).
WORKER_ERROR = """
import zipfile
import torch.utils.data
from safeloader.demo import describe_error

class Broken(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, index):
        raise zipfile.BadZipFile({message!r})

try:
    list(torch.utils.data.DataLoader(Broken(), num_workers=1))
except Exception as error:
    assert str(error).startswith("Caught BadZipFile in DataLoader worker process 0."), str(error)
    print("shown:", describe_error(error), flush=True)
"""


@pytest.mark.timeout(60)
def test_a_worker_error_is_shown_as_its_type_and_original_message():
    message = "Bad CRC-32 for file 'item_003.npy'"
    result = run_python(WORKER_ERROR.format(message=message), timeout=50)
    assert not result.timed_out and result.returncode == 0, str(result)
    assert f"shown: BadZipFile: {message}\n" in result.stdout, str(result)


def test_a_long_or_multiline_message_is_cut_at_a_word_boundary():
    wrapped = RuntimeError(
        "Caught HookError in DataLoader worker process 3.\n"
        "Original Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in _worker_loop\n'
        "    data = fetcher.fetch(index)\n"
        "           ^^^^^^^^^^^^^^^^^^^^\n"
        "safeloader.errors.HookError: hook 'mylib' failed in after_in_child\n"
        "in worker 3: " + "disk quota exceeded " * 20
    )
    shown = describe_error(wrapped, limit=100)
    assert shown.startswith("HookError: hook 'mylib' failed in after_in_child in worker 3: disk quota"), shown
    assert len(shown) <= 100 and shown.endswith("..."), shown
    assert shown[:-3].split()[-1] in {"disk", "quota", "exceeded"}, shown  # whole words only
    assert describe_error(ValueError("short")) == "ValueError: short"
    assert describe_error(KeyError("missing")) == "KeyError: 'missing'"
    assert describe_error(StopIteration()) == "StopIteration"
    assert shorten("one two three four", 12) == "one two..."
