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
