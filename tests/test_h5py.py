"""h5py files opened in a Dataset's __init__ work in forked, spawned and forkserver workers."""

from __future__ import annotations

import io
import warnings

import h5py
import numpy as np
import pytest
from torch.utils.data import Dataset

from safeloader import DataLoader, get_options
from safeloader.backends import h5py as h5py_backend

from .h5py_data import H5Items, direct_h5, write_h5
from .helpers import (
    MEMBERS,
    RECORD,
    SHARED_OFFSET,
    assert_torch_loader_fails,
    check_random_reads,
    check_workers_and_parent,
    random_loader,
    write_archives,
    write_records,
)
from .subproc import check_script

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(60)]


@pytest.mark.parametrize("driver", [None, "stdio", "fileobj"])
def test_h5py_read_correctly_in_4_workers(tmp_path, driver):
    path = tmp_path / "data.h5"
    data = write_h5(path)
    dataset = H5Items(str(path), driver)
    expected = direct_h5(path)
    assert (expected[:, 0] == data).all()
    check_workers_and_parent(dataset, expected)


@pytest.mark.torch_baseline
@pytest.mark.timeout(90)
@pytest.mark.parametrize("driver", ["stdio", "fileobj"])
def test_same_h5py_dataset_under_torch_loader_fails(tmp_path, driver):
    path = tmp_path / "data.h5"
    write_h5(path)
    assert_torch_loader_fails("tests.h5py_data:h5_case", str(path), driver, expect=SHARED_OFFSET)


class InMemory(Dataset):
    """HDF5 files with no file behind them: File.in_memory, and fileobj on BytesIO."""

    def __init__(self, data: np.ndarray) -> None:
        buffer = io.BytesIO()
        with h5py.File(buffer, "w") as f:
            f["x"] = data
        self.image = h5py.File.in_memory(buffer.getvalue())
        self.bytes_file = h5py.File(io.BytesIO(buffer.getvalue()), "r")

    def __len__(self) -> int:
        return len(self.image["x"])

    def __getitem__(self, i: int):
        return i, np.stack([self.image["x"][i], self.bytes_file["x"][i]])


def test_in_memory_files_work_in_forked_workers_and_are_refused_for_spawn(tmp_path, recwarn):
    data = write_h5(tmp_path / "unused.h5")
    dataset = InMemory(data)
    expected = np.repeat(data[:, None, :], 2, axis=1)
    check_random_reads(random_loader(DataLoader, dataset), expected, seconds=0.5)
    assert not [w for w in recwarn if issubclass(w.category, h5py_backend.WritableFileWarning)]
    with pytest.raises(TypeError, match="in-memory"):
        h5py_backend.reduce_file(dataset.image)
    with pytest.raises(TypeError, match=r"'fileobj' driver.*open it by path"):
        h5py_backend.reduce_file(dataset.bytes_file)


class Writer(Dataset):
    """Holds its file writable; item i reads row i, and writes it back if asked to."""

    def __init__(self, path: str, write: bool) -> None:
        self.file = h5py.File(path, "r+")
        self.rows = self.file["plain/contiguous"]
        self.write = write

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        row = self.rows[i]
        if self.write:
            self.rows[i] = 0
            self.file.flush()  # into the parent's file, unless safeloader stops it
        return row


def test_writable_file_warns_once_and_workers_cannot_write_it(tmp_path):
    path = tmp_path / "data.h5"
    data = write_h5(path)
    dataset = Writer(str(path), write=False)
    with pytest.warns(h5py_backend.WritableFileWarning, match=f"{path}.*open it read-only"):
        rows = list(DataLoader(dataset, batch_size=8, num_workers=2))
    assert (rows[0].numpy() == data[:8]).all()  # reading works, as of the fork

    dataset.write = True
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        iterator = iter(DataLoader(dataset, batch_size=8, num_workers=1))
    assert not [w for w in again if issubclass(w.category, h5py_backend.WritableFileWarning)]  # once per file
    try:
        with pytest.raises(Exception, match=r"(?i)write|flush"):  # the worker's flush fails: read-only
            next(iterator)
    finally:
        iterator._shutdown_workers()
    dataset.file.close()
    with h5py.File(path, "r") as f:  # nothing a worker did reached the file
        assert (f["plain/contiguous"][:] == data).all()
        assert (f["compressed"][:] == data).all()


def test_writable_file_and_spawn_pickling_errors_say_what_to_do(tmp_path):
    path = tmp_path / "data.h5"
    write_h5(path)
    with h5py.File(path, "r+") as f, pytest.raises(TypeError, match=r"open for writing.*h5py.File\(path, 'r'\)"):
        h5py_backend.reduce_file(f)
    with h5py.File(path, "r") as f:
        function, args = h5py_backend.reduce_file(f)
        reopened = function(*args)
        assert reopened is function(*args)  # one handle per file and worker
        assert reopened.mode == "r" and reopened.filename == f.filename
        reopened.close()


def test_h5py_objects_pickle_as_before_outside_a_safeloader_start(tmp_path):
    path = tmp_path / "data.h5"
    write_h5(path)
    h5py_backend.BACKEND.prepare_start(None, get_options(), "spawn")
    from multiprocessing.reduction import ForkingPickler

    with h5py.File(path, "r") as f, pytest.raises(TypeError, match="h5py objects cannot be pickled"):
        ForkingPickler.dumps(f["compressed"])


# -- spawn and forkserver -----------------------------------------------------------


@pytest.mark.timeout(150)  # six spawn/forkserver worker starts, each importing torch: 60-110 s under CI's load
def test_same_dataset_works_under_forkserver_and_spawn(tmp_path):
    h5 = tmp_path / "data.h5"
    data = write_h5(h5, count=MEMBERS)
    _, npz, _ = write_archives(tmp_path)
    records, _, _ = write_records(tmp_path, count=MEMBERS)
    out = check_script("h5py_spawn_and_forkserver.py", h5, npz, records, timeout=140).stdout
    assert "TORCH TypeError h5py objects cannot be pickled" in out, out
    assert f"OK forkserver {MEMBERS}" in out and f"OK spawn {MEMBERS}" in out, out
    moved = next(line for line in out.splitlines() if line.startswith("MOVED"))
    assert "FileNotFoundError" in moved, moved
    assert f"DataLoader worker 0 could not reopen HDF5 file '{h5}'" in out, out
    assert "PARENT True" in out  # the parent's own handles still read the moved file
    assert data.shape == (MEMBERS, RECORD)
