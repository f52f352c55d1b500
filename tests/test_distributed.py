"""safeloader under torchrun: 2 gloo ranks on CPU, each forking 2 armed workers.

Each rank is a process that already holds threads (gloo's, and zarrs' Rust pool
after a read in the rank itself) when its DataLoader forks workers, and one of
gloo's collectives is in flight at each fork. The ranks run under ``torchrun``
(a c10d rendezvous on 127.0.0.1, gloo on the loopback interface) inside a
subprocess with a deadline, so a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid

import numpy as np
import pytest
import zarr

from .subproc import CHILDREN, run_script

pytestmark = pytest.mark.timeout(180)

LENGTH = 40  # divisible by the world size: DistributedSampler pads nothing
ROW = 64
WORLD = 2
EPOCHS = 2
WORKERS = 2

@pytest.fixture(scope="module")
def chunked_array(tmp_path_factory) -> tuple[str, np.ndarray]:
    """A compressed (LENGTH, ROW) array, one shard per row, each of 8 chunks.

    Reading a row decodes its 8 chunks on zarrs' Rust thread pool, which a
    forked worker inherits without its threads.
    """
    path = str(tmp_path_factory.mktemp("ddp") / "rows.zarr")
    data = np.arange(LENGTH * ROW, dtype="float32").reshape(LENGTH, ROW)
    array = zarr.create_array(path, shape=data.shape, shards=(1, ROW), chunks=(1, 8), dtype="float32")
    array[:] = data
    return path, data


def run_ranks(tmp_path, array_path: str, which: str, batch_timeout: float, deadline: float):
    out_dir = tmp_path / f"out-{which}"
    out_dir.mkdir()
    argv = [
        "--nnodes=1",
        f"--nproc-per-node={WORLD}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",  # a free port on the loopback interface only
        f"--rdzv-id={uuid.uuid4().hex}",
        "--max-restarts=0",
        "--monitor-interval=0.2",
        str(CHILDREN / "ddp_rank.py"),
        which, array_path, str(out_dir), str(EPOCHS), str(WORKERS), str(batch_timeout),
    ]
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    result = run_script("torchrun.py", *argv, timeout=deadline, env=env)
    return result, out_dir


def test_two_gloo_ranks_with_zarrs_read_first_see_every_index_once(tmp_path, chunked_array):
    array_path, _ = chunked_array
    result, out_dir = run_ranks(tmp_path, array_path, "safeloader", batch_timeout=30, deadline=150)
    assert not result.timed_out and result.returncode == 0, f"torchrun failed:\n{result}"

    reports = [json.loads((out_dir / f"rank-{rank}.json").read_text()) for rank in range(WORLD)]
    assert [r["world"] for r in reports] == [WORLD] * WORLD
    orders = []
    for epoch in range(EPOCHS):
        per_rank = [r["epochs"][epoch] for r in reports]
        for report in per_rank:
            # Value for value what the rank read directly, in torch's sampler order.
            assert report["mismatched_batches"] == 0
            assert report["seen"] == report["expected_order"]
            assert len(report["seen"]) == LENGTH // WORLD
            assert report["all_ranks"] == [p["seen"] for p in per_rank]
        together = sorted(i for p in per_rank for i in p["seen"])
        assert together == list(range(LENGTH))  # disjoint and complete
        orders.append([p["seen"] for p in per_rank])
    assert orders[0] != orders[1]  # set_epoch reshuffled

    for report in reports:
        rank = report["rank"]
        lines = (out_dir / f"armed-{rank}").read_text().split()
        armed = [tuple(int(v) for v in lines[i : i + 3]) for i in range(0, len(lines), 3)]
        # The hook ran in each worker of each epoch, and those workers did the reading.
        assert sorted(w for _, w, _ in armed) == sorted(list(range(WORKERS)) * EPOCHS)
        assert {n for _, _, n in armed} == {WORKERS}
        armed_pids = {pid for pid, _, _ in armed}
        readers = {pid for e in report["epochs"] for pid in e["reader_pids"]}
        assert readers == armed_pids and report["pid"] not in armed_pids


@pytest.mark.torch_baseline
def test_same_ranks_with_torch_loader_hang_in_the_workers(tmp_path, chunked_array):
    # The failure the previous test guards against: torch's own loader, same
    # ranks and Dataset; the forked workers wait forever on the zarrs pool they
    # inherited without its threads, so no batch arrives within the loader's timeout.
    array_path, _ = chunked_array
    result, _ = run_ranks(tmp_path, array_path, "torch", batch_timeout=10, deadline=120)
    assert not result.timed_out, f"torchrun did not even fail in time:\n{result}"
    assert result.returncode != 0
    assert "DataLoader timed out after 10" in result.stderr, str(result)


# -- threads at fork: another loader's pin-memory thread ------------------------

@pytest.mark.parametrize("which", ["safeloader", "torch"])
def test_second_loader_forks_safely_while_a_pin_memory_thread_pins(tmp_path, which):
    # torch issue 130610: a pin-memory thread inside native code at a fork can
    # leave glibc's atexit lock held in the worker, which then hangs at its
    # first C++ static initialisation (torch.Generator() in torch's worker loop).
    # safeloader's "pin_memory" backend makes worker forks wait for pin_memory() calls.
    result = run_script("pin_thread.py", which, timeout=90)
    assert not result.timed_out, str(result)
    if which == "safeloader":
        assert result.returncode == 0 and "20 loaders ok" in result.stdout, str(result)
    else:  # the failure the backend fixes: a worker hangs, no batch within the loader's timeout
        assert result.returncode == 3 and "DataLoader timed out after 5" in result.stdout, str(result)


class Pinnable:
    """Stands in for a batch on an accelerator: pinning waits for a go signal."""

    def __init__(self, go: threading.Event | None = None) -> None:
        self.go = go
        self.entered = threading.Event()
        self.pinned = threading.Event()

    def pin_memory(self):
        self.entered.set()
        if self.go is not None:
            assert self.go.wait(30)
        self.pinned.set()
        return self


@pytest.mark.timeout(60)
def test_pin_memory_gate_lets_forks_wait_for_pinning_and_passes_nested_batches():
    import torch.utils.data._utils.pin_memory as pin_module

    from safeloader import DataLoader
    from safeloader.backends import pin_memory as gate

    list(DataLoader(range(4), num_workers=1))  # the first armed start installs the gate
    assert gate.gated() and pin_module.pin_memory is not gate.BACKEND.original

    nested = {"a": [Pinnable(), Pinnable()], "b": (Pinnable(),)}
    assert pin_module.pin_memory(nested) == nested  # torch recurses through the gate: no self-wait
    assert all(item.pinned.is_set() for item in [*nested["a"], *nested["b"]]) and gate.BACKEND.gate.inside == 0

    go = threading.Event()
    in_progress = Pinnable(go)
    pinning = threading.Thread(target=pin_module.pin_memory, args=(in_progress,))
    pinning.start()
    assert in_progress.entered.wait(30)
    threading.Timer(0.2, go.set).start()
    assert gate.BACKEND.gate.close(timeout=30)  # what `before` does: wait for the call in progress
    assert in_progress.pinned.is_set()
    late = Pinnable()
    waiting = threading.Thread(target=pin_module.pin_memory, args=(late,))
    waiting.start()
    assert not late.entered.wait(0.3)  # held at the gate while "forking"
    gate.BACKEND.gate.open()  # what `after_in_parent` does
    assert late.pinned.wait(30)
    pinning.join(30), waiting.join(30)
    assert gate.BACKEND.gate.inside == 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
