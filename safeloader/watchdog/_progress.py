"""A worker's progress, as its heartbeat tells the parent: ``_Beat`` writes the worker's slot
(``_heartbeat``: busy, each item done, collating, idle), from wrappers around the fetcher torch's
worker loop creates (its fetch, its ``collate_fn``, the Dataset or iterator it reads).

How it works and why: docs/internals.md, ``safeloader.watchdog``.
"""

from __future__ import annotations

import time
from typing import Any

from .. import _torch_internals
from ._heartbeat import BATCH, BUSY, COLLATING, IDLE, ITEMS, LAST, STATE, Heartbeats

__all__ = ["current_beat", "in_watched_worker", "instrument_fetchers", "start_beat"]


# -- the worker's heartbeat ----------------------------------------------------------


class _Beat:
    """Heartbeat writer of this worker process."""

    def __init__(self, watch: Heartbeats, base: int, python_fd: int, native_fd: int) -> None:
        self.watch = watch
        self.slots = watch.slots
        self.base = base
        self.python_fd = python_fd  # open for the worker's life: faulthandler writes to it (-1: none)
        self.native_fd = native_fd
        # (python signal, its handler's address, native signal, its handler's address); 0: none.
        self.signals: tuple[int, int, int, int] = (0, 0, 0, 0)

    def busy(self, batch: int = 1) -> None:
        self.slots[self.base + LAST] = time.monotonic()  # time first: the parent never sees BUSY with a stale time
        self.slots[self.base + BATCH] = float(batch)
        self.slots[self.base + STATE] = BUSY

    def collating(self, batch: int) -> None:
        self.slots[self.base + LAST] = time.monotonic()
        self.slots[self.base + BATCH] = float(batch)
        self.slots[self.base + STATE] = COLLATING

    def item_done(self, count: int = 1) -> None:
        self.slots[self.base + ITEMS] += count
        self.slots[self.base + LAST] = time.monotonic()

    def idle(self) -> None:
        self.slots[self.base + LAST] = time.monotonic()
        self.slots[self.base + STATE] = IDLE


_worker_beat: _Beat | None = None


def start_beat(watch: Heartbeats, base: int, python_fd: int, native_fd: int) -> _Beat:
    """In a worker entering its watch (``_worker.enter_worker``): its heartbeat, from now on."""
    global _worker_beat
    _worker_beat = _Beat(watch, base, python_fd, native_fd)
    return _worker_beat


def current_beat() -> _Beat | None:
    """This worker's heartbeat, None outside a watched worker."""
    return _worker_beat


def in_watched_worker() -> bool:
    """Whether this process is a DataLoader worker with the stall watchdog's signal handlers installed."""
    return _worker_beat is not None


# -- progress, counted where torch's fetcher reads the Dataset -------------------------


class _CountingMapDataset:
    """What the worker's map-style fetcher reads through: counts each item done."""

    def __init__(self, dataset: Any, beat: _Beat) -> None:
        self._dataset = dataset
        self._beat = beat
        getitems = getattr(dataset, "__getitems__", None)
        # torch's fetcher uses __getitems__ when it is truthy; keep that choice.
        self.__getitems__ = self._getitems if getitems else None
        self._original_getitems: Any = getitems

    def __getitem__(self, index: Any) -> Any:
        item = self._dataset[index]
        self._beat.item_done()
        return item

    def _getitems(self, indices: Any) -> Any:
        count = _count(indices)
        self._beat.busy(count)  # the call works on `count` items: a budget for each
        items = self._original_getitems(indices)
        self._beat.item_done(count)
        self._beat.busy()
        return items

    def __len__(self) -> int:
        return len(self._dataset)


def _count(batch: Any) -> int:
    try:
        return max(1, len(batch))
    except TypeError:  # no len(): one item's budget
        return 1


class _CountingIterator:
    """The Dataset's iterator, each item counted as done. Not a generator: an exception from the
    iterator must leave it usable for the next ``next()``, as under torch's fetcher (a generator
    ends at the first exception that passes through it, and the rest of the worker's items would be
    lost). Its other attributes are the iterator's (torchdata saves a Stateful one's state_dict)."""

    def __init__(self, iterator: Any, beat: _Beat) -> None:
        self._iterator = iterator
        self._beat = beat

    def __iter__(self) -> _CountingIterator:
        return self

    def __next__(self) -> Any:
        item = next(self._iterator)
        self._beat.item_done()
        return item

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_iterator", "_beat"):
            raise AttributeError(name)
        return getattr(self._iterator, name)


def _watch_fetcher(fetcher: Any, beat: _Beat) -> Any:
    fetch = fetcher.fetch

    def watched_fetch(index: Any) -> Any:
        beat.busy()
        try:
            return fetch(index)
        finally:
            beat.idle()

    fetcher.fetch = watched_fetch
    collate = getattr(fetcher, "collate_fn", None)
    if collate is not None:

        def watched_collate(batch: Any) -> Any:
            beat.collating(_count(batch))  # its own phase, with a budget per item collated
            return collate(batch)

        fetcher.collate_fn = watched_collate
    # Per-item progress, where the fetcher's structure is the one we know;
    # otherwise progress is counted per batch.
    if hasattr(fetcher, "dataset_iter"):
        fetcher.dataset_iter = _CountingIterator(fetcher.dataset_iter, beat)
    elif _torch_internals.is_map_fetcher(fetcher):
        fetcher.dataset = _CountingMapDataset(fetcher.dataset, beat)
    return fetcher


_fetchers_instrumented = False


def instrument_fetchers() -> None:
    """In worker processes: every fetcher torch's worker loop creates is watched. Only a process
    with a heartbeat (a worker) watches its fetchers: elsewhere torch's fetcher is returned as
    is. So the parent installs it once, before forking (``_worker.prepare_forks``), and a forked worker
    finds it in place; a spawn/forkserver worker installs its own."""
    global _fetchers_instrumented
    if not _fetchers_instrumented:
        _fetchers_instrumented = _torch_internals.wrap_create_fetcher(_watch_if_in_worker)


def _watch_if_in_worker(fetcher: Any) -> Any:
    beat = _worker_beat
    return _watch_fetcher(fetcher, beat) if beat is not None else fetcher
