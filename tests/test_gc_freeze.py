"""The "gc" backend: with freeze_gc, a worker's garbage collection leaves the parent's objects shared."""

from __future__ import annotations

import gc
import json
import os

import psutil
import pytest
import torch
from torch.utils.data import Dataset

import safeloader

from .subproc import check_python, check_script

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(90)]

MIB = 2**20


class FreezeCount(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> str:
        return json.dumps([index, gc.get_freeze_count()])


def worker_freeze_counts(**options) -> list[int]:
    items = [json.loads(x) for x in safeloader.DataLoader(FreezeCount(), batch_size=None, num_workers=2, **options)]
    assert [i for i, _ in items] == [0, 1, 2, 3]
    return [count for _, count in items]


def test_freeze_gc_is_on_by_default():
    assert safeloader.get_options().freeze_gc is True


def test_workers_keep_the_parent_objects_frozen_and_the_parent_does_not():
    assert gc.get_freeze_count() == 0
    counts = worker_freeze_counts()
    assert all(count > 10_000 for count in counts)  # every tracked object of this pytest process
    assert gc.get_freeze_count() == 0


def test_freeze_gc_false_freezes_nothing():
    assert worker_freeze_counts(freeze_gc=False) == [0, 0, 0, 0]
    safeloader.configure(freeze_gc=False)
    assert worker_freeze_counts() == [0, 0, 0, 0]


def test_objects_the_program_froze_itself_are_left_to_it():
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        newer = [[i] for i in range(50_000)]  # tracked, not frozen: a freeze by us would add them
        counts = worker_freeze_counts()
        assert all(mine - 10_000 < count <= mine for count in counts)  # some frozen objects die meanwhile
        assert mine - 10_000 < gc.get_freeze_count() <= mine  # not unfrozen behind the program's back
        del newer
    finally:
        gc.unfreeze()


def test_the_parents_young_objects_stay_young_so_an_iterator_in_a_cycle_is_collected_as_under_torch():
    # An iterator left in a reference cycle (a caught exception's traceback makes one) is freed by
    # the next young collection under torch's loader, which then stops its workers. Freezing and
    # unfreezing the parent around each fork moved it into the oldest generation instead: its
    # workers stayed until a full collection, and piled up over failed epochs.
    out = check_python(
        """
        import gc, multiprocessing, weakref
        import torch, safeloader

        class Items(torch.utils.data.Dataset):
            def __len__(self): return 8
            def __getitem__(self, index): return index

        gc.disable()  # only the loaders move objects between generations here
        for name, loader_class in (("torch", torch.utils.data.DataLoader), ("safeloader", safeloader.DataLoader)):
            gc.collect()
            # One worker: torch's shutdown from a collection waits 5 s for each.
            iterator = iter(loader_class(Items(), batch_size=None, num_workers=1))
            next(iterator)
            iterator.cycle = iterator
            freed = weakref.ref(iterator)
            del iterator
            gc.collect(1)  # the two young generations, not a full collection
            print(name, "iterator freed:", freed() is None, "workers left:", len(multiprocessing.active_children()))
        """,
        timeout=60,
    ).stdout
    assert out.splitlines() == [
        "torch iterator freed: True workers left: 0", "safeloader iterator freed: True workers left: 0",
    ], out


# Issue 42, item 4: a sampler building a throw-away structure of a million small reference cycles
# in __iter__, which torch runs inside iter(loader) (tests/children/cyclic_sampler.py). gc was paused
# from a start's first fork to its end: no collection ran while the sampler built its cycles, and
# the parent's peak RSS grew by what they held (278 MB here, 461 MB in the issue), where under
# torch's loader young collections free them as they go (3 MB). Paused around each fork only now.
def test_a_samplers_cyclic_garbage_is_collected_during_the_start_as_under_torch():
    runs = {}
    for loader in ("torch", "safeloader"):
        result = check_script("cyclic_sampler.py", loader, "1000000", timeout=40)
        runs[loader] = json.loads(result.stdout.splitlines()[-1])
    for loader, run in runs.items():
        assert run["gc enabled in __iter__"] is True and run["collections"] > 100, (loader, run)
        assert run["epoch"] == [[0, 1], [2, 3], [4, 5], [6, 7]], (loader, run)
    # The cycles hold about 280 MB when nothing collects them; torch's loader grows a few MB.
    assert runs["safeloader"]["peak MB grown"] <= runs["torch"]["peak MB grown"] + 40, runs


class Records(Dataset):
    """Many GC-tracked containers; item 0 reports how much a full collection copied in the worker."""

    def __init__(self, n: int) -> None:
        self.records = [{"id": i, "bbox": [i, i + 1, i + 2, i + 3]} for i in range(n)]

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> torch.Tensor:
        me = psutil.Process()
        before = me.memory_full_info().uss
        gc.collect()
        copied = me.memory_full_info().uss - before
        return torch.tensor([copied / MIB, os.getpid()])


@pytest.fixture(scope="module")
def records() -> Records:
    return Records(400_000)


@pytest.mark.torch_baseline
def test_worker_collection_copies_parent_objects_under_torch_loader(records):
    # The failure freeze_gc fixes (torch issue 13246): the worker's full
    # collection writes the header of every parent container, copying its pages.
    (copied, _), = list(torch.utils.data.DataLoader(records, batch_size=None, num_workers=1))
    assert copied > 20  # about 50 MiB for 400k records on 64-bit CPython 3.11


def test_worker_collection_copies_little_with_freeze_gc(records):
    (plain, _), = list(safeloader.DataLoader(records, batch_size=None, num_workers=1, freeze_gc=False))
    (frozen, _), = list(safeloader.DataLoader(records, batch_size=None, num_workers=1, freeze_gc=True))
    assert plain > 20
    assert frozen < plain / 4
