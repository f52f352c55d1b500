"""Helpers shared by test modules and their child processes.

The random-read harness (workers and parent reading the same handles; the same
Dataset under torch's own loader in a fresh interpreter) and the plain-file and
npz data that test_files, test_npz and test_h5py read.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, RandomSampler

from safeloader import DataLoader

from .subproc import run_script

RECORD = 64  # bytes per record
COUNT = 512  # records per file
SECONDS = 0.5  # of random reads per case (4 workers on 2 cores: each second of reads costs 2 s of CPU)
MEMBERS = 200  # arrays per npz archive


# -- random-read harness ------------------------------------------------------------


def random_loader(loader_class, dataset, num_workers: int = 4, **kwargs):
    """4 workers reading random items, with replacement, more than anyone will read."""
    sampler = RandomSampler(dataset, replacement=True, num_samples=10**7)
    return loader_class(dataset, batch_size=8, sampler=sampler, num_workers=num_workers, **kwargs)


MIN_ITEMS = 200
"""check_random_reads reads at least this many items, however long a loaded machine takes."""


def check_random_reads(loader, expected: np.ndarray, seconds: float = SECONDS, parent_check=None) -> int:
    """Read items ``(index, values)`` for ``seconds`` (and at least ``MIN_ITEMS``); every value must
    equal ``expected[index]``.

    ``parent_check`` runs in the parent after each batch (its own reads, while
    workers run). Returns the number of items checked.
    """
    checked = 0
    iterator = iter(loader)
    start = time.monotonic()
    try:
        for index, values in iterator:
            want = torch.from_numpy(expected[index.numpy()])
            wrong = (values != want).flatten(1).any(1)
            assert not wrong.any(), f"{int(wrong.sum())} wrong items of {len(index)}, indices {index[wrong].tolist()}"
            checked += len(index)
            if parent_check is not None:
                parent_check()
            if time.monotonic() - start > seconds and checked >= MIN_ITEMS:
                break
    finally:
        iterator._shutdown_workers()
    return checked


def check_workers_and_parent(dataset, expected: np.ndarray) -> None:
    """4 workers read random items for a few seconds through the handles ``dataset`` opened in
    ``__init__``, while the parent reads through the same handles after each batch; every
    value must equal the direct read ``expected``."""
    rng = np.random.default_rng(1)

    def parent_reads() -> None:
        i = int(rng.integers(len(expected)))
        assert (dataset[i][1] == expected[i]).all()

    checked = check_random_reads(random_loader(DataLoader, dataset), expected, parent_check=parent_reads)
    assert checked >= MIN_ITEMS
    parent_reads()


def count_failures(loader, expected: np.ndarray, seconds: float) -> tuple[int, int, str]:
    """Like ``check_random_reads``, but counts wrong items and errors; stops at the first
    failure or after ``seconds``. Returns (items read, wrong items, first error)."""
    checked = wrong = 0
    error = ""
    iterator = iter(loader)
    start = time.monotonic()
    try:
        while time.monotonic() - start < seconds and not (wrong or error):
            index, values = next(iterator)
            want = torch.from_numpy(expected[index.numpy()])
            wrong += int((values != want).flatten(1).any(1).sum())
            checked += len(index)
    except Exception as exc:  # a worker's read failed: torch re-raises it here
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        iterator._shutdown_workers()
    return checked, wrong, error


FAILURES = ("hang", "wrong data", "error")
"""How torch's own loader can fail on a case: killed at its deadline, items unequal to the direct read, or raising."""
SHARED_OFFSET = ("wrong data", "error")
"""A file's offset shared by the workers: reads land at other workers' offsets (wrong bytes, or a
format error where the bytes do not parse), never a hang."""


def assert_torch_loader_fails(case: str, *args: str, expect: str | tuple[str, ...], tries: int = 1,
                              seconds: float = 20.0) -> str:
    """Run the Dataset that ``case`` (``"module:function"``, called with ``args``, returning
    ``(dataset, expected)``) makes under torch's own DataLoader in a fresh interpreter
    (children/torch_loader_reads.py): it must fail in one of the ways ``expect`` names
    (``FAILURES``), and no other. Returns what happened.
    ``tries`` > 1 for races that a run can miss (processes sharing one connection may
    happen to take turns): the failure must show in one of that many runs."""
    expected = (expect,) if isinstance(expect, str) else expect
    assert set(expected) <= set(FAILURES), f"expect must be among {FAILURES}, got {expect!r}"
    for _ in range(tries):
        result = run_script("torch_loader_reads.py", case, seconds, *args, timeout=60, expect_hang=True)
        if result.timed_out:
            outcome, what = "hang", "hang"
        else:
            assert result.returncode == 0, f"the script itself failed:\n{result}"
            line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT"))
            _, checked, wrong, error = line.split(" ", 3)
            if int(wrong) > 0:
                outcome, what = "wrong data", f"{wrong} wrong items of {checked}"
            elif error != "''":
                outcome, what = "error", error
            else:
                continue
        assert outcome in expected, f"torch's loader was expected to fail with {expected}, but: {what}\n{result}"
        return what
    raise AssertionError(f"torch's loader read {checked} items correctly in {tries} run(s): the failure was not shown")


# -- plain files --------------------------------------------------------------------


def write_records(directory: Path, count: int = COUNT, seed: int = 0) -> tuple[Path, Path, np.ndarray]:
    """A binary file of ``count`` records and a text file of the same records in hex."""
    data = np.random.default_rng(seed).integers(0, 256, (count, RECORD), dtype=np.uint8)
    binary, text = directory / "records.bin", directory / "records.txt"
    data.tofile(binary)
    text.write_text("".join(row.tobytes().hex() + "\n" for row in data))
    return binary, text, data


class Records(Dataset):
    """Reads record i through four handles opened here: buffered, unbuffered, text, raw descriptor."""

    def __init__(self, binary: str, text: str) -> None:
        self.buffered = open(binary, "rb")
        self.unbuffered = open(binary, "rb", buffering=0)
        self.text = open(text)
        self.fd = os.open(binary, os.O_RDONLY)
        self.count = os.path.getsize(binary) // RECORD

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        self.buffered.seek(i * RECORD)
        a = self.buffered.read(RECORD)
        self.unbuffered.seek(i * RECORD)
        b = self.unbuffered.read(RECORD)
        self.text.seek(i * (2 * RECORD + 1))
        c = bytes.fromhex(self.text.readline().strip())
        os.lseek(self.fd, i * RECORD, os.SEEK_SET)
        d = os.read(self.fd, RECORD)
        return i, np.stack([np.frombuffer(x, np.uint8) for x in (a, b, c, d)])


def direct_records(binary: Path) -> np.ndarray:
    """Expected values: a direct read of the file, once per handle kind."""
    data = np.fromfile(binary, np.uint8).reshape(-1, RECORD)
    return np.repeat(data[:, None, :], 4, axis=1)


def records_case(binary: str, text: str) -> tuple[Records, np.ndarray]:
    """For ``assert_torch_loader_fails``: Records over the two files, and their direct read."""
    return Records(binary, text), direct_records(Path(binary))


# -- npz archives -------------------------------------------------------------------


def write_archives(directory: Path, seed: int = 0) -> tuple[Path, Path, np.ndarray]:
    """The same ``MEMBERS`` arrays in a stored and in a deflate-compressed archive."""
    data = np.random.default_rng(seed).integers(0, 256, (MEMBERS, RECORD), dtype=np.uint8)
    members = {f"m{i}": row for i, row in enumerate(data)}
    plain, compressed = directory / "plain.npz", directory / "compressed.npz"
    np.savez(plain, **members)
    np.savez_compressed(compressed, **members)
    return plain, compressed, data


class Archives(Dataset):
    """Item i: member ``m{i}`` of both archives, opened here with np.load."""

    def __init__(self, plain: str, compressed: str) -> None:
        self.plain = np.load(plain)
        self.compressed = np.load(compressed)

    def __len__(self) -> int:
        return MEMBERS

    def __getitem__(self, i: int):
        return i, np.stack([self.plain[f"m{i}"], self.compressed[f"m{i}"]])


def direct_archives(plain: Path, compressed: Path) -> np.ndarray:
    """Expected values: a fresh np.load of each archive, read in this process."""
    with np.load(plain) as p, np.load(compressed) as c:
        return np.stack([np.stack([p[f"m{i}"], c[f"m{i}"]]) for i in range(MEMBERS)])


def archives_case(plain: str, compressed: str) -> tuple[Archives, np.ndarray]:
    """For ``assert_torch_loader_fails``: Archives over the two archives, and their direct read."""
    return Archives(plain, compressed), direct_archives(Path(plain), Path(compressed))
