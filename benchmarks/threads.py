"""Thread-based contenders: the same Dataset, sampler and collation as torch's loader, no processes.

``ThreadPoolLoader`` maps ``__getitem__`` over a ``concurrent.futures.ThreadPoolExecutor``;
``SpdlLoader`` runs it as SPDL's thread pipeline (``spdl.pipeline.PipelineBuilder``). Both take
a DataLoader's arguments, with ``num_workers`` threads instead of processes, and yield
collated batches, so the suite's ``epoch`` (and its checksum) applies to them unchanged.
Threads share the parent's memory and native state: no fork hazard, no start-up, but every
``__getitem__`` holds the GIL except where its library releases it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.utils.data import Dataset, RandomSampler
from torch.utils.data._utils.collate import default_collate

# How long SPDL may wait for one batch: a hang must reach the suite's deadline as a hang, not
# as an SPDL timeout error, so this is longer than any deadline the suite sets.
SPDL_TIMEOUT = 3600.0


class ThreadPoolLoader:
    """``for batch in ThreadPoolLoader(dataset, batch_size=4, num_workers=2)``: items from a thread pool."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int = 1,
        num_workers: int = 0,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        self.dataset, self.batch_size, self.threads = dataset, batch_size, max(1, num_workers)
        self.shuffle, self.generator = shuffle, generator

    def indices(self) -> Iterable[int]:
        """A RandomSampler's permutation, drawn from the loader's generator as torch's loader does
        (not the same order as torch's, which first draws its workers' seed: checksums ignore order)."""
        if self.shuffle:
            return list(RandomSampler(self.dataset, generator=self.generator))  # type: ignore[arg-type]
        return range(len(self.dataset))  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        with ThreadPoolExecutor(self.threads, thread_name_prefix="loader") as pool:
            yield from batches(pool.map(self.dataset.__getitem__, self.indices()), self.batch_size)


class SpdlLoader(ThreadPoolLoader):
    """The same through SPDL: a source of indices, ``__getitem__`` with ``num_workers``-way
    concurrency on the pipeline's thread pool, batching, collation, a bounded output queue."""

    def __iter__(self) -> Iterator[Any]:
        from spdl.pipeline import PipelineBuilder

        pipeline = (
            PipelineBuilder()
            .add_source(self.indices())
            .pipe(self.dataset.__getitem__, concurrency=self.threads)
            .aggregate(self.batch_size)
            .pipe(default_collate)
            .add_sink(buffer_size=2)
            # max_failures=0: an item that raises stops the epoch (SPDL's default drops it silently);
            # a queue.Queue sink: SPDL's lower-latency hand-off of batches to this thread
            .build(num_threads=self.threads, max_failures=0, use_thread_output_queue=True)
        )
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=SPDL_TIMEOUT)


def batches(items: Iterable[Any], size: int) -> Iterator[Any]:
    """Collate ``items`` in groups of ``size`` (the last one may be shorter), as torch's loader does."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield default_collate(batch)
            batch = []
    if batch:
        yield default_collate(batch)
