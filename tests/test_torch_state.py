"""The "torch" backend: a worker that uses CUDA the parent initialised gets a clear error.

No GPU here: ``torch.cuda.is_initialized`` is monkeypatched in the parent, and
the fork carries the patch into the workers. On this CPU build, any CUDA use
goes through ``torch.cuda._lazy_init``, which is exactly what the backend
replaces in such a worker, so the path taken is the real one.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

import safeloader
from safeloader.backends import torch_state

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(60)]

# These tests stand in for a GPU (see above): where torch has a usable one (torch.cuda.is_available()),
# the stand-in fails in torch's own seeding of each worker, a worker may use CUDA for real, and torch
# 2.11 refuses autograd in any forked worker after a backward in the parent; there, the real
# paths are checked by scripts/cuda_check.py (checked on an H200, 2026-11-26).
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="stands in for CUDA: scripts/cuda_check.py on a GPU")


class UsesCuda(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((2,), float(index), device="cuda")


class CpuOnly(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.arange(3.0) * index


def consume(loader) -> list:
    """All batches; on error, shut the workers down now rather than at their next liveness check."""
    iterator = iter(loader)
    try:
        return list(iterator)
    finally:
        iterator._shutdown_workers()


@pytest.fixture
def cuda_initialised_in_parent(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert torch_state.initialised_accelerators() == ("cuda",)


@cpu_only
def test_worker_using_cuda_gets_an_error_saying_what_and_what_to_do(cuda_initialised_in_parent):
    with pytest.raises(torch_state.ForkedAcceleratorError) as info:
        consume(safeloader.DataLoader(UsesCuda(), num_workers=2))
    message = str(info.value)
    assert "DataLoader worker" in message
    assert "CUDA was initialised in the parent process before the workers were forked" in message
    assert "move each batch to the device in the training loop" in message
    assert "multiprocessing_context='spawn'" in message


@pytest.mark.torch_baseline
@cpu_only
def test_torch_loader_reports_another_error_for_the_same_dataset(cuda_initialised_in_parent):
    # What the backend replaces. On a GPU machine torch says "Cannot re-initialize
    # CUDA in forked subprocess ... you must use the 'spawn' start method"; on
    # this CPU build, the CPU build's own message.
    with pytest.raises(Exception) as info:
        consume(torch.utils.data.DataLoader(UsesCuda(), num_workers=2))
    assert not isinstance(info.value, torch_state.ForkedAcceleratorError)
    assert "initialised in the parent" not in str(info.value)


@cpu_only
def test_cpu_dataset_still_works_with_cuda_initialised_in_parent(cuda_initialised_in_parent):
    # Model on the GPU, Dataset on the CPU, forked workers: the normal set-up.
    # No error before the workers start.
    got = list(safeloader.DataLoader(CpuOnly(), batch_size=3, num_workers=2))
    expected = list(torch.utils.data.DataLoader(CpuOnly(), batch_size=3, num_workers=0))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


@cpu_only
def test_without_cuda_in_parent_the_backend_leaves_cuda_alone():
    assert torch_state.initialised_accelerators() == ()
    with pytest.raises(Exception) as info:
        consume(safeloader.DataLoader(UsesCuda(), num_workers=1))
    assert not isinstance(info.value, torch_state.ForkedAcceleratorError)


@cpu_only
def test_disabled_torch_hook_leaves_torch_error(cuda_initialised_in_parent):
    with pytest.raises(Exception) as info:
        consume(safeloader.DataLoader(UsesCuda(), num_workers=1, disable_hooks={"torch"}))
    assert not isinstance(info.value, torch_state.ForkedAcceleratorError)


class Backward(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        weight = torch.full((3,), float(index), requires_grad=True)
        (weight * weight).sum().backward()
        return weight.grad


@cpu_only
def test_cpu_autograd_in_workers_after_backward_in_parent():
    # torch 2.13 marks a forked child bad for autograd only after a GPU backward
    # in the parent; CPU backward in both is fine, so the backend adds nothing.
    weight = torch.ones(3, requires_grad=True)
    (weight * 2).sum().backward()
    got = torch.cat(list(safeloader.DataLoader(Backward(), batch_size=None, num_workers=2)))
    expected = torch.cat([Backward()[i] for i in range(4)])
    assert torch.equal(got, expected)


# -- where a lazily queued accelerator call came from (_lazy_stacks) ----------------------------


class SeedingReport(Dataset):
    """Each item: what the worker's seeding of the accelerators not initialised noted (torch's worker loop
    calls torch.manual_seed before any item: CUDA, XPU, MTIA; not CUDA where the parent used it, which a
    CUDA build's ``torch.cuda.is_available()`` does), and which source files the worker read into
    linecache since ``snapshot``."""

    def __len__(self) -> int:
        return 2

    def snapshot(self) -> None:
        import linecache

        self.cached = set(linecache.cache)

    def __getitem__(self, index: int) -> dict:
        import linecache

        read = sorted(set(linecache.cache) - self.cached)  # first: reading the text below reads sources
        noted = [
            stack
            for module in (torch.cuda, getattr(torch, "xpu", None), getattr(torch, "mtia", None))
            for call in getattr(getattr(module, "_lazy_seed_tracker", None), "get_calls", list)()
            if call
            for stack in call[1:]
        ]
        return {
            "kinds": sorted(type(stack).__name__ for stack in noted),
            "texts": ["".join(stack) for stack in noted],
            "read": read,
        }


def _seeding_report(loader_class, context: str | None = None) -> dict:
    dataset = SeedingReport()
    dataset.snapshot()
    return next(iter(loader_class(dataset, batch_size=None, num_workers=1, multiprocessing_context=context)))


def test_a_workers_seeding_notes_where_it_came_from_without_reading_source_files():
    """torch's worker loop seeds CUDA before the device exists: torch keeps the seeding call, and with
    it ``traceback.format_stack()``, for an error message should the call fail later. Formatting reads
    the source file of every frame (2-3 ms and 300 copied pages of each worker's start): under
    safeloader the stack is kept and formatted only when read, to the same text."""
    # torch's loader given the fork context, as safeloader's start gives torch (safeloader._done_event):
    # the default context's Process adds a frame of its own (context.py's Process._Popen) to the stack.
    torch_report = _seeding_report(torch.utils.data.DataLoader, "fork")
    assert torch_report["kinds"] and set(torch_report["kinds"]) == {"list"}, torch_report
    assert torch_report["read"], torch_report  # torch read the sources
    report = _seeding_report(safeloader.DataLoader)
    assert report["kinds"] == ["FormattedStack"] * len(torch_report["kinds"]), report
    assert report["read"] == [], report
    text = report["texts"][0]
    assert "in _worker_loop\n" in text and "in manual_seed_all\n" in text
    # Each frame of torch's text, its file, line and function, is in safeloader's (whose stack also holds
    # safeloader's own frames, around the fork), with its source line; but this test's own (another line).
    this_test = f" in {test_a_workers_seeding_notes_where_it_came_from_without_reading_source_files.__name__}"
    frames = [line for line in torch_report["texts"][0].splitlines()
              if line.startswith("  File ") and not line.endswith(this_test)]
    assert frames and all(frame in text for frame in frames), (frames, text)
    assert "    torch.manual_seed(seed)\n" in text


def test_the_formatted_stack_is_tracebacks_text():
    import traceback

    from safeloader.backends import _lazy_stacks

    def caller():
        return _lazy_stacks.format_stack(), traceback.format_stack()

    lazy, formatted = caller()
    # The same frames and source lines; traceback also underlines a part of some lines (3.11+):
    # a position a stack of (file, line, function) does not keep.
    assert list(lazy) == [_without_carets(entry) for entry in formatted]
    assert len(lazy) == len(formatted) and lazy[-1] == _without_carets(formatted[-1])
    assert "".join(lazy) == "".join(_without_carets(entry) for entry in formatted)


def _without_carets(entry: str) -> str:
    lines = entry.splitlines(keepends=True)
    return "".join(line for line in lines if line.strip(" ^~\n"))
