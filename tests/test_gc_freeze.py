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
