"""Ray Train and HF Accelerate, run for real on the CPU, reading a zarr array through zarrs.

Both rebuild the user's loader from torch's class, so only ``safeloader.install()``
arms its workers:

- Ray Train runs the training function in separate worker processes (actors);
  ``install()`` must run there, at the top of the training function. Each rank's
  ``prepare_data_loader`` loader then forks armed workers.
- Accelerate (1.15) wraps the loader it rebuilds in ``DataLoaderShard`` /
  ``DataLoaderDispatcher`` (adapters around a torch ``DataLoader``, or torchdata's
  ``StatefulDataLoader`` with ``use_stateful_dataloader=True``).

Each case first shows the failure: the training process decodes once (zarrs'
Rust pool now exists in it), and torch's forked workers then hang on their
first multi-chunk read; the loader's own ``timeout`` turns the hang into
"DataLoader timed out", and the child process runs under a deadline as well.
Everything runs in a child process (``run_script``), so Ray's processes and any
hung worker die with its process group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .subproc import run_script

ROOT = Path(__file__).resolve().parent.parent
HANG = "DataLoader timed out"

# The children: tests/children/ray_train.py and accelerate_train.py, over the Dataset of
# tests/children/zarr_blocks.py (the array opened in __init__, 4-chunk items).
RAY_SCRIPT = "ray_train.py"
ACCELERATE_SCRIPT = "accelerate_train.py"


def run_child(script: str, tmp_path: Path, modes: tuple[str, ...], timeout: float):
    out = tmp_path / "out"
    out.mkdir()
    env = {"RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    return run_script(script, out, *modes, timeout=timeout, env=env, cwd=str(ROOT)), out


def armed_workers(out: Path, parent_pid: int) -> set[int]:
    path = out / f"armed-{parent_pid}"
    return {int(pid) for pid in path.read_text().split()} if path.exists() else set()


@pytest.mark.timeout(420)
def test_ray_train_hangs_without_install_and_every_rank_reads_its_shard_with_install_in_the_train_function(
    tmp_path,
):
    # Both runs in one Ray session (one Ray start instead of two: about 25 s less). About 55 s on a
    # quiet machine; Ray's dozen processes, starved beside two suites on 2 cores, once took over 220 s.
    result, out = run_child(RAY_SCRIPT, tmp_path, ("torch", "install"), timeout=400)
    assert not result.timed_out and result.returncode == 0, str(result)
    runs = dict(line[2:].split(" ", 1) for line in result.stdout.splitlines() if line.startswith("@@"))
    # torch's workers hang: the loader's timeout fails the rank, and no rank got through its epoch.
    assert runs["torch"].startswith("failed") and HANG in runs["torch"], str(result)
    assert not list((out / "torch").glob("rank-*.json"))
    # with install(): complete, disjoint shards, each read correct, each rank's workers armed.
    assert runs["install"] == "ok", str(result)
    reports = [json.loads((out / "install" / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert sorted(i for r in reports for i in r["seen"]) == list(range(16))
    for report in reports:
        assert report["correct"], report  # every block equals a direct read
        assert report["type"] == "DataLoader" and report["sampler"] == "DistributedSampler"
        assert len(report["seen"]) == 8
        assert len(armed_workers(out / "install", report["pid"])) == 2  # its 2 workers ran safeloader's hooks


def accelerate_report(result) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith("@@")]
    assert lines, str(result)
    return json.loads(lines[-1][2:])


@pytest.mark.torch_baseline
@pytest.mark.timeout(120)
def test_accelerate_without_install_hangs_after_the_training_process_decoded(tmp_path):
    result, _ = run_child(ACCELERATE_SCRIPT, tmp_path, ("torch",), timeout=100)
    assert result.timed_out or (result.returncode != 0 and HANG in result.stderr), str(result)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "wrapper", "inner"),
    [
        ("install", "DataLoaderShard", "SafeDataLoader"),  # accelerate imported after install()
        ("dispatcher", "DataLoaderDispatcher", "SafeDataLoader"),
        ("stateful", "DataLoaderShard", "StatefulDataLoader"),
    ],
)
def test_accelerate_prepared_loader_is_armed_after_install(tmp_path, mode, wrapper, inner):
    result, out = run_child(ACCELERATE_SCRIPT, tmp_path, (mode,), timeout=100)
    assert not result.timed_out and result.returncode == 0, str(result)
    report = accelerate_report(result)
    assert (report["type"], report["inner"]) == (wrapper, inner)
    assert report["correct"]  # every block equals a direct read
    armed = {int(pid) for path in out.glob("armed-*") for pid in path.read_text().split()}
    if mode == "stateful":
        # 3 batches, a checkpoint, then a fresh loader resumed from it: the epoch exactly once.
        assert report["seen"] == list(range(6)) and report["resumed"] == list(range(6, 16))
        # Both loaders' workers ran the hooks; resuming StatefulDataLoader may start its workers once more.
        assert len(armed) >= 4 and len(armed) % 2 == 0, armed
    else:
        assert sorted(report["seen"]) == list(range(16)) and report["resumed"] == []
        assert len(armed) == 2
