"""Plain files opened in a Dataset's __init__ read correctly in forked workers."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, RandomSampler

import safeloader
from safeloader import DataLoader
from safeloader.backends import files as files_backend

from .helpers import (
    RECORD,
    SHARED_OFFSET,
    Records,
    assert_torch_loader_fails,
    check_random_reads,
    check_workers_and_parent,
    direct_records,
    random_loader,
    write_records,
)
from .subproc import check_script

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(60)]


def test_plain_files_opened_in_init_read_correctly_in_4_workers(tmp_path):
    binary, text, _ = write_records(tmp_path)
    dataset = Records(str(binary), str(text))
    expected = direct_records(binary)
    check_workers_and_parent(dataset, expected)


@pytest.mark.torch_baseline
@pytest.mark.timeout(90)
def test_same_plain_files_under_torch_loader_give_wrong_data_or_errors(tmp_path):
    binary, text, _ = write_records(tmp_path)
    assert_torch_loader_fails("tests.helpers:records_case", str(binary), str(text), expect=SHARED_OFFSET)


def test_parent_offset_and_buffer_are_untouched_by_workers(tmp_path):
    binary, text, data = write_records(tmp_path)
    dataset = Records(str(binary), str(text))
    dataset.buffered.seek(10 * RECORD + 3)
    os.lseek(dataset.fd, 7 * RECORD, os.SEEK_SET)
    check_random_reads(random_loader(DataLoader, dataset, num_workers=2), direct_records(binary), seconds=0.5)
    assert dataset.buffered.tell() == 10 * RECORD + 3
    assert dataset.buffered.read(RECORD - 3) == data[10, 3:].tobytes()
    assert os.lseek(dataset.fd, 0, os.SEEK_CUR) == 7 * RECORD


class SequentialReader(Dataset):
    """Item i: the next record from where the parent left the file, plus the worker's pid."""

    def __init__(self, path: str, start: int) -> None:
        self.file = open(path, "rb")
        self.file.seek(start * RECORD)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return np.frombuffer(self.file.read(RECORD), np.uint8).copy()


def test_each_worker_continues_from_the_parents_position(tmp_path):
    binary, _, data = write_records(tmp_path)
    dataset = SequentialReader(str(binary), start=5)
    # Each worker reads its first item from the parent's position (record 5),
    # not from where a sibling left a shared offset.
    batches = list(DataLoader(dataset, batch_size=1, num_workers=4))
    assert [b[0].tolist() for b in batches] == [data[5].tolist()] * 4


def test_deleted_and_moved_files_still_read_the_parents_file(tmp_path):
    binary, text, _ = write_records(tmp_path)
    dataset = Records(str(binary), str(text))
    expected = direct_records(binary)
    binary.rename(tmp_path / "moved.bin")
    text.unlink()
    check_random_reads(random_loader(DataLoader, dataset), expected, seconds=0.5)


class Shards(Dataset):
    """Record i from shard i % len(shards), through the unbuffered files of a list the Dataset opened
    in ``__init__`` (hundreds: found by the walk's search by kind, privatized by one C call each worker)."""

    def __init__(self, paths: list[str]) -> None:
        self.shards = [open(path, "rb", buffering=0) for path in paths]

    def __len__(self) -> int:
        return len(self.shards) * SHARD_RECORDS

    def __getitem__(self, i: int):
        f = self.shards[i % len(self.shards)]
        f.seek(i // len(self.shards) * RECORD)
        return i, np.frombuffer(f.read(RECORD), np.uint8)[None]


SHARD_RECORDS = 4


def test_hundreds_of_shards_the_dataset_holds_each_read_at_their_own_offset_and_leave_the_parents_alone(tmp_path):
    count = 300
    data = np.random.default_rng(3).integers(0, 256, (count, SHARD_RECORDS, RECORD), dtype=np.uint8)
    paths = []
    for shard in range(count):
        paths.append(str(tmp_path / f"shard{shard}.bin"))
        data[shard].tofile(paths[-1])
    dataset = Shards(paths)
    for shard, f in enumerate(dataset.shards):  # where the parent left each one
        f.seek(shard % SHARD_RECORDS * RECORD + 5)
    expected = data.transpose(1, 0, 2).reshape(-1, 1, RECORD)  # item i: shard i % count, record i // count
    assert check_random_reads(random_loader(DataLoader, dataset), expected, seconds=0.5)
    assert [f.tell() for f in dataset.shards] == [shard % SHARD_RECORDS * RECORD + 5 for shard in range(count)]


class RecordsWithConfig(Records):
    """Records, plus a file the process holds open read-only but the Dataset never reads
    (a library's config or log): the kind of descriptor whose reopen may fail."""

    def __init__(self, binary: str, text: str, config: str) -> None:
        super().__init__(binary, text)
        self.config = open(config, "rb")
        self.config_again = open(config, "rb")  # two descriptors, one path: one warning

    def __getitem__(self, i: int):
        index, values = super().__getitem__(i)
        config_readable = os.pread(self.config.fileno(), 100, 0) == os.pread(self.config_again.fileno(), 100, 0) != b""
        return index, values, "\n".join(_worker_warnings), config_readable


_worker_warnings: list[str] = []  # in a worker: the SharedFileWarnings the "files" hook gave


def refuse_reopen_in_workers(fds: list[int], code: int) -> None:
    """Make the "files" hook's reopen of ``fds`` fail in each worker with errno ``code``,
    and record the worker's warnings: a child hook that runs before "files" (first=True)."""

    def refuse() -> None:
        from safeloader import native

        real_privatize = native.privatize_files

        def privatize_refusing(records, skip, *args):  # as if reopening each of fds failed
            privatized, failed = real_privatize(records, (*skip, *fds), *args)
            return privatized, (*failed, *((fd, code) for fd in fds))

        native.privatize_files = privatize_refusing  # in this worker only: its own copy of the module
        warnings.simplefilter("always")

        def record(message, category, *args, **kwargs):  # as text, for the Dataset to return
            _worker_warnings.append(f"{category.__name__}: {message}")

        warnings.showwarning = record

    safeloader.register_at_fork(after_in_child=refuse, name="test-refuse-reopen", first=True)


@pytest.mark.parametrize("code", [errno.EACCES, errno.ESTALE], ids=["EACCES", "ESTALE"])
def test_failed_reopen_leaves_the_descriptor_shared_with_one_warning_per_worker(tmp_path, code):
    binary, text, _ = write_records(tmp_path)
    config = tmp_path / "library.cfg"
    config.write_bytes(b"level = 3\n")
    dataset = RecordsWithConfig(str(binary), str(text), str(config))
    refuse_reopen_in_workers([dataset.config.fileno(), dataset.config_again.fileno()], code)
    expected = direct_records(binary)
    loader = DataLoader(dataset, batch_size=8, sampler=RandomSampler(dataset), num_workers=2)
    seen: dict[int, set[str]] = {}
    iterator = iter(loader)
    try:
        for index, values, messages, config_readable in iterator:  # one epoch; torch's loader would work too
            want = torch.from_numpy(expected[index.numpy()])
            assert (values == want).all(), "the other files were not given their own offsets"
            assert config_readable.all(), "the refused descriptors no longer read the file"
            for message in messages:
                found = message.split("\n")
                assert len(found) == 1, found  # once per path, though two descriptors of it were refused
                worker = int(found[0].split("DataLoader worker ")[1].split(" ")[0])
                seen.setdefault(worker, set()).update(found)
    finally:
        iterator._shutdown_workers()
    assert set(seen) == {0, 1}, seen
    for worker, found in seen.items():
        (message,) = found
        assert message.startswith("SharedFileWarning: ")
        assert f"DataLoader worker {worker} " in message and repr(str(config)) in message
        assert f"[Errno {code}]" in message and "shared" in message and "as with torch" in message
    assert issubclass(files_backend.SharedFileWarning, RuntimeWarning)


class LockHolder(Dataset):
    """Reports whether the worker's descriptor still shares the parent's locked description."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "rb")
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int):
        with open(f"/proc/self/fdinfo/{self.file.fileno()}") as info:
            return any(line.startswith("lock:") for line in info)


def test_descriptor_holding_an_exclusive_lock_is_left_shared(tmp_path):
    binary, _, _ = write_records(tmp_path)
    dataset = LockHolder(str(binary))
    # A worker re-locking a private copy would block on the parent's lock.
    assert list(DataLoader(dataset, num_workers=1)) == [torch.tensor([True])]


class ManyShardsOneLocked(Dataset):
    """Shards the Dataset holds, more than the parent reads the locks of on its lock reader thread,
    one of them (in the middle: read by that thread or by a worker) exclusively locked. Each item
    seeks its shard and re-locks the locked one without blocking: it reports whether that worked,
    and the shard's offset after its seek."""

    def __init__(self, directory, count: int) -> None:
        self.shards = []
        for i in range(count):
            (directory / f"{i}.bin").write_bytes(bytes(range(64)))
            self.shards.append(open(directory / f"{i}.bin", "rb"))
        self.locked = self.shards[count // 2]
        fcntl.flock(self.locked, fcntl.LOCK_EX)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        try:  # a worker re-locking a private copy of the parent's locked description would block
            fcntl.flock(self.locked, fcntl.LOCK_EX | fcntl.LOCK_NB)
            relocked = True
        except BlockingIOError:
            relocked = False
        shard = self.shards[i]
        shard.seek(10 + i)
        return relocked, shard.read(1)[0]


def test_many_held_files_are_private_and_a_locked_one_stays_shared_with_its_locks_read_behind(tmp_path, monkeypatch):
    # Above files_backend._READ_BEHIND held files the parent reads their locks on a thread of its own
    # while it forks (the workers find them read): the locked one is still found and left shared,
    # every other shard is the worker's own (its seeks leave the parent's offsets at 0).
    readers = []
    real = files_backend.native.read_locks_behind
    monkeypatch.setattr(files_backend.native, "read_locks_behind",
                        lambda *args: readers.append(real(*args)) or readers[-1])
    count = files_backend._READ_BEHIND * 3
    dataset = ManyShardsOneLocked(tmp_path, count)
    items = list(DataLoader(dataset, batch_size=None, num_workers=3))
    assert items == [[True, 10 + i] for i in range(8)], items  # batch_size=None: the tuple collated to a list
    assert [os.lseek(shard.fileno(), 0, os.SEEK_CUR) for shard in dataset.shards] == [0] * count
    assert len(readers) == 1 and (readers[0] is not None) == safeloader.NATIVE, readers


def test_files_hook_can_be_disabled_per_loader(tmp_path):
    binary, _, data = write_records(tmp_path)
    dataset = SequentialReader(str(binary), start=0)
    items = list(DataLoader(dataset, batch_size=1, num_workers=1, disable_hooks=("files",)))
    assert items[0][0].tolist() == data[0].tolist()
    # Without the hook the worker moved the shared offset: the parent sees it.
    assert os.lseek(dataset.file.fileno(), 0, os.SEEK_CUR) != 0


# -- pickling for spawn/forkserver (the workers themselves run in test_h5py) ---------


def test_file_reduction_applies_only_while_a_safeloader_loader_starts(tmp_path):
    binary, _, _ = write_records(tmp_path)
    files_backend.BACKEND.prepare_start(None, safeloader.get_options(), "spawn")
    from multiprocessing.reduction import ForkingPickler

    with open(binary, "rb") as f:
        with pytest.raises(TypeError, match="cannot pickle"):
            ForkingPickler.dumps(f)
        with pytest.raises(TypeError, match="cannot pickle"):
            pickle.dumps(f)


def test_text_and_writable_files_are_refused_for_spawn_with_a_clear_message(tmp_path):
    binary, text, _ = write_records(tmp_path)
    with open(text) as f, pytest.raises(TypeError, match="binary mode"):
        files_backend.reduce_file(f)
    with open(binary, "r+b") as f, pytest.raises(TypeError, match=r"open\(path, 'rb'\)"):
        files_backend.reduce_file(f.raw)


def test_reopened_file_keeps_position_and_refuses_a_replaced_file(tmp_path):
    binary, _, data = write_records(tmp_path)
    with open(binary, "rb") as f:
        f.seek(3 * RECORD)
        function, args = files_backend.reduce_file(f)
    reopened = function(*args)
    assert reopened.read(RECORD) == data[3].tobytes()
    reopened.close()
    binary.rename(tmp_path / "old.bin")
    binary.write_bytes(b"x" * 1000)  # another file at the same path
    stand_in = function(*args)
    with pytest.raises(FileNotFoundError, match=f"could not reopen file '{binary}'.*replaced or moved"):
        stand_in.read(RECORD)
    assert safeloader.hooks()  # the registry is intact


@pytest.mark.timeout(120)
def test_only_the_files_the_dataset_holds_get_their_own_offset_in_a_worker_and_the_rest_stay_as_under_torch():
    # A parent holding 200 read-only files its Dataset never reaches (a shard cache of the training
    # script's) and 4 the Dataset holds (an attribute, a list, a closure, a raw descriptor number).
    # Each worker reopened all 204 at every start (~70 us each); now it reopens the Dataset's 4, and
    # a file only the parent holds shares its offset with the workers, as under torch's loader.
    torch_found = json.loads(check_script("files_reached.py", "torch", 200, timeout=60).stdout.splitlines()[-1])
    assert torch_found == {"moved": dict.fromkeys(["attribute", "listed", "raw", "closure", "shard0"], True),
                           "private": None}  # torch: every offset shared, the Dataset's too
    found = json.loads(check_script("files_reached.py", "safeloader", 200, timeout=60).stdout.splitlines()[-1])
    assert found == {"moved": {"attribute": False, "listed": False, "raw": False, "closure": False, "shard0": True},
                     "private": 4}


class _Reader:
    def __init__(self, f) -> None:
        self.f = f


class _Refusing:
    """Raises on any attribute it lacks, and on len(): a walk must step over it."""

    __slots__ = ("unset",)

    def __getattr__(self, name):
        raise KeyError(name)

    def __len__(self) -> int:
        raise RuntimeError("no length")


def test_the_walk_finds_files_behind_large_containers_closures_and_partials_and_steps_over_objects_that_raise(
    tmp_path,
):
    import functools
    import types

    from safeloader.backends import _held_files

    binary, _, _ = write_records(tmp_path)
    files = [open(binary, "rb") for _ in range(6)]
    elsewhere = open(binary, "rb")  # held by no object of the loader's
    try:
        dataset = types.SimpleNamespace(
            records=[{"id": i, "box": [1.0, 2.0]} for i in range(5000)],  # large, searched by kind: no file
            readers=[_Reader(files[0])] * 40 + [_Reader(files[1])],  # large: the 41st found since the 1st held one
            rows=[{"file": files[2]}] + [{"file": None}] * 40,
            refusing=_Refusing(),
            fd=os.dup(files[3].fileno()),  # a raw descriptor number in an attribute
        )
        captured = files[4]
        loader = types.SimpleNamespace(
            dataset=dataset,
            collate_fn=lambda batch: (captured, batch),
            worker_init_fn=functools.partial(print, files[5]),
        )
        names: dict[int, bytes] = {}
        found = _held_files.held_descriptors(loader, names)
        assert found == {dataset.fd, *(files[i].fileno() for i in (0, 1, 2, 4, 5))}, found
        assert elsewhere.fileno() not in found
        # The path each file object was opened by, for the worker's reopen; none for a raw descriptor.
        assert names == {files[i].fileno(): os.fsencode(binary) for i in (0, 1, 2, 4, 5)}, names
        os.close(dataset.fd)
    finally:
        for f in (*files, elsewhere):
            f.close()


def test_the_walk_finds_a_module_global_the_datasets_methods_read_and_not_one_they_do_not(tmp_path):
    """The training script's ``DATA = np.load(...)`` at module level, read in ``__getitem__``, is
    the Dataset's as much as an attribute: a worker reads it through the shared offset."""
    import types

    from safeloader.backends import _held_files

    binary, _, _ = write_records(tmp_path)
    script = {"__name__": "training_script", "READ": open(binary, "rb"), "UNREAD": open(binary, "rb"),
              "SCRIPT_COLLATE": open(binary, "rb")}
    exec(  # a module of the user's: its globals as the methods see them
        "class Items:\n"
        "    def __getitem__(self, i):\n"
        "        return [READ.read(1) for _ in range(i)]\n"
        "def collate(batch):\n"
        "    return SCRIPT_COLLATE, batch\n",
        script,
    )
    try:
        loader = types.SimpleNamespace(dataset=script["Items"](), collate_fn=script["collate"])
        found = _held_files.held_descriptors(loader)
        assert found == {script["READ"].fileno(), script["SCRIPT_COLLATE"].fileno()}, found
    finally:
        for name in ("READ", "UNREAD", "SCRIPT_COLLATE"):
            script[name].close()


def test_the_walk_visits_a_bounded_number_of_objects_however_deeply_large_containers_nest(monkeypatch):
    """Probes of large containers within probes multiplied: an s3fs client's object graph took
    minutes to search. Every visit, probes included, counts against one budget."""
    import types

    from safeloader.backends import _held_files

    tree: list = []
    for _ in range(8):  # each item its own list of the level below's items: small in memory, deep to search
        tree = [types.SimpleNamespace(inner=list(tree)) for _ in range(34)]
    visits = 0
    held_by = _held_files._held_by

    def counting(*args, **kwargs):
        nonlocal visits
        visits += 1
        return held_by(*args, **kwargs)

    monkeypatch.setattr(_held_files, "_held_by", counting)
    found = _held_files.held_descriptors(types.SimpleNamespace(dataset=types.SimpleNamespace(tree=tree)))
    assert visits <= _held_files._MAX_NODES, visits
    assert found == set()  # each level's kind probed, none holds a file


def test_a_search_cut_short_or_a_kind_holding_raw_descriptors_still_finds_every_file(tmp_path):
    """Files beyond the search's reach must not be left shared silently: a Dataset with more
    readers than the search visits gets every read-only file made private; readers that hold raw
    descriptor numbers (``self.fd = os.open(...)``) in a large list are searched, not dropped."""
    import types

    from safeloader.backends import _held_files

    binary, _, _ = write_records(tmp_path)
    fds = [os.open(binary, os.O_RDONLY) for _ in range(40)]
    try:
        readers = [types.SimpleNamespace(fd=fd) for fd in fds]
        found = _held_files.held_descriptors(types.SimpleNamespace(dataset=types.SimpleNamespace(readers=readers)))
        assert found == set(fds), found
        chain = types.SimpleNamespace(next=None, fd=fds[0])  # a file beyond the search's 20,000 objects
        for _ in range(_held_files._MAX_NODES + 10):
            chain = types.SimpleNamespace(next=chain)
        found = _held_files.held_descriptors(types.SimpleNamespace(dataset=types.SimpleNamespace(chain=chain)))
        assert found == _held_files.EVERY_FILE
        index = list(range(50_000))  # a very large container of plain values: nothing to search, no cut
        found = _held_files.held_descriptors(types.SimpleNamespace(dataset=types.SimpleNamespace(index=index)))
        assert found == set()
    finally:
        for fd in fds:
            os.close(fd)
