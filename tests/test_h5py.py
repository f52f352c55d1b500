"""h5py files opened in a Dataset's __init__ work in forked, spawned and forkserver workers."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from torch.utils.data import Dataset

from safeloader import DataLoader, get_options
from safeloader.backends import h5py as h5py_backend

from .subproc import check_python
from .test_files import (
    COUNT,
    RECORD,
    REPO,
    assert_torch_loader_fails,
    check_random_reads,
    check_workers_and_parent,
    random_loader,
)
from .test_npz import MEMBERS

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(60)]


def write_h5(path: Path, count: int = COUNT, seed: int = 0) -> np.ndarray:
    """``/compressed``: chunked, gzip; ``/plain/contiguous``: contiguous; same records."""
    data = np.random.default_rng(seed).integers(0, 256, (count, RECORD), dtype=np.uint8)
    with h5py.File(path, "w") as f:
        f.create_dataset("compressed", data=data, chunks=(16, RECORD), compression="gzip", shuffle=True)
        f.create_group("plain").create_dataset("contiguous", data=data)
    return data


def open_h5(path: str, driver: str | None) -> h5py.File:
    if driver == "fileobj":
        return h5py.File(open(path, "rb"), "r")  # a Python file object
    return h5py.File(path, "r", driver=driver)


class H5Items(Dataset):
    """Item i: row i of a compressed and of a contiguous dataset, through objects made here."""

    def __init__(self, path: str, driver: str | None = None) -> None:
        self.file = open_h5(path, driver)
        self.compressed = self.file["compressed"]  # a Dataset object held across the fork
        self.group = self.file["plain"]  # a Group object held across the fork

    def __len__(self) -> int:
        return len(self.compressed)

    def __getitem__(self, i: int):
        return i, np.stack([self.compressed[i], self.group["contiguous"][i]])


def direct_h5(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return np.stack([f["compressed"][:], f["plain/contiguous"][:]], axis=1)


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
    setup = f"""
        from pathlib import Path
        from tests.test_h5py import H5Items, direct_h5
        dataset = H5Items({str(path)!r}, {driver!r})
        expected = direct_h5(Path({str(path)!r}))
    """
    assert_torch_loader_fails(setup)


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
    h5py_backend.prepare_start(None, get_options(), "spawn")
    from multiprocessing.reduction import ForkingPickler

    with h5py.File(path, "r") as f, pytest.raises(TypeError, match="h5py objects cannot be pickled"):
        ForkingPickler.dumps(f["compressed"])


# -- spawn and forkserver -----------------------------------------------------------


class Everything(Dataset):
    """Item i through each kind of handle opened in __init__: h5py File, Dataset and
    Group, an npz archive and a buffered file."""

    def __init__(self, h5: str, npz: str, records: str) -> None:
        self.file = h5py.File(h5, "r", rdcc_nbytes=2**20)
        self.compressed = self.file["compressed"]
        self.group = self.file["plain"]
        self.archive = np.load(npz)
        self.records = open(records, "rb")

    def __len__(self) -> int:
        return MEMBERS

    def __getitem__(self, i: int):
        self.records.seek(i * RECORD)
        record = np.frombuffer(self.records.read(RECORD), np.uint8)
        rows = [self.compressed[i], self.group["contiguous"][i], self.archive[f"m{i}"], record]
        return i, np.stack(rows)


@pytest.mark.timeout(120)
def test_same_dataset_works_under_forkserver_and_spawn(tmp_path):
    from .test_files import write_records
    from .test_npz import write_archives

    h5 = tmp_path / "data.h5"
    data = write_h5(h5, count=MEMBERS)
    _, npz, _ = write_archives(tmp_path)
    records, _, _ = write_records(tmp_path, count=MEMBERS)
    code = f"""
        import os, sys, warnings
        sys.path.insert(0, {REPO!r})
        warnings.simplefilter("ignore")
        import numpy as np
        import torch.utils.data
        import safeloader
        from tests.test_h5py import Everything
        dataset = Everything({str(h5)!r}, {str(npz)!r}, {str(records)!r})
        expected = np.stack([dataset[i][1] for i in range(len(dataset))])
        try:
            list(torch.utils.data.DataLoader(dataset, num_workers=1, multiprocessing_context="spawn"))
            print("TORCH ok")
        except TypeError as exc:
            print("TORCH TypeError", exc)
        for method in ("forkserver", "spawn"):
            loader = safeloader.DataLoader(dataset, batch_size=10, num_workers=2, multiprocessing_context=method)
            checked = 0
            for index, values in loader:
                assert (values.numpy() == expected[index.numpy()]).all(), method
                checked += len(index)
            print("OK", method, checked)
        os.rename({str(h5)!r}, {str(h5)!r} + ".moved")
        try:
            list(safeloader.DataLoader(dataset, num_workers=1, multiprocessing_context="spawn"))
            print("MOVED no error")
        except OSError as exc:
            print("MOVED", type(exc).__name__, " | ".join(str(exc).splitlines()))
        print("PARENT", (dataset[3][1] == expected[3]).all())
    """
    out = check_python(code, timeout=110).stdout
    assert "TORCH TypeError h5py objects cannot be pickled" in out, out
    assert f"OK forkserver {MEMBERS}" in out and f"OK spawn {MEMBERS}" in out, out
    moved = next(line for line in out.splitlines() if line.startswith("MOVED"))
    assert "FileNotFoundError" in moved, moved
    assert f"DataLoader worker 0 could not reopen HDF5 file '{h5}'" in out, out
    assert "PARENT True" in out  # the parent's own handles still read the moved file
    assert data.shape == (MEMBERS, RECORD)
