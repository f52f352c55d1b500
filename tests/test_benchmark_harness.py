"""The benchmark suite runs end to end on a tiny configuration (shape of its output, never timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.contenders import THREADS
from benchmarks.threads import SpdlLoader, ThreadPoolLoader

from .subproc import run_python

pytestmark = [pytest.mark.timeout(300), pytest.mark.tooling]

ROOT = Path(__file__).resolve().parent.parent


def test_suite_runs_on_a_tiny_configuration_and_writes_json_table_and_chart(tmp_path):
    output = tmp_path / "suite.json"
    result = run_python(
        f"""
import sys
from benchmarks.__main__ import main
sys.exit(main(["--tiny", "--repeats", "1", "--only", "npz", "Python-heavy",
               "--skip", "forkserver", "per item", "per worker", "--output", {str(output)!r}]))
""",
        timeout=240,
        cwd=str(ROOT),
    )
    assert not result.timed_out and result.returncode == 0, str(result)
    data = json.loads(output.read_text())
    assert set(data) == {"machine", "config", "elapsed_s", "scenarios"}
    assert {"date", "cores", "platform", "versions"} <= set(data["machine"])
    assert data["machine"]["versions"]["torch"].startswith("2.")
    assert data["config"]["repeats"] == 1
    assert list(data["scenarios"]) == ["npz opened in __init__", "Python-heavy transform (holds the GIL)"]
    for scenario, contenders in data["scenarios"].items():
        assert "safeloader" in contenders, scenario
        for name, entry in contenders.items():
            assert entry["status"] == "ok" or entry["status"].startswith(("hang", "error: ")), (name, entry)
            if entry["status"] == "ok":
                assert entry["n"] == 1 and entry["min"] <= entry["median"] <= entry["max"]
                assert isinstance(entry["correct"], bool)
        assert contenders["safeloader"]["status"] == "ok" and contenders["safeloader"]["correct"]
        assert contenders["safeloader"]["ratio_to_safeloader"] == pytest.approx(1.0)
        assert not any("forkserver" in name for name in contenders), list(contenders)  # --skip
    assert "spawn" in data["scenarios"]["npz opened in __init__"]  # a slow start still runs
    # Thread-based contenders run the same Dataset, checked against the same checksum.
    for name in THREADS:
        entry = data["scenarios"]["Python-heavy transform (holds the GIL)"][name]
        assert entry["status"] == "ok" and entry["correct"], (name, entry)
        # Threads share the Dataset's one NpzFile: Python 3.13's zipfile can refuse that
        # (BadZipFile "Overlapped entries"), which is recorded as the contender's error;
        # data it returns must be correct.
        entry = data["scenarios"]["npz opened in __init__"][name]
        assert (entry["status"] == "ok" and entry["correct"]) or entry["status"].startswith("error: "), (name, entry)
    # The failure safeloader fixes is recorded as such, not waited out or dropped.
    assert data["scenarios"]["npz opened in __init__"]["spawn"]["status"].startswith("error: ")
    assert output.with_suffix(".png").stat().st_size > 1000
    assert "| **safeloader** |" in result.stdout


def test_executors_scenario_reports_epoch_and_first_batch_side_by_side(tmp_path):
    # torch's fork with the parent's executor hangs (60 s deadline), spawn and forkserver start slowly: left out.
    output = tmp_path / "suite.json"
    result = run_python(
        f"""
import sys
from benchmarks.__main__ import main
sys.exit(main(["--tiny", "--repeats", "1", "--only", "ThreadPoolExecutor made in __init__",
               "--skip", "torch fork", "spawn", "forkserver", "SPDL", "--output", {str(output)!r}]))
""",
        timeout=120,
        cwd=str(ROOT),
    )
    assert not result.timed_out and result.returncode == 0, str(result)
    [contenders] = json.loads(output.read_text())["scenarios"].values()
    assert list(contenders) == ["lazy per worker, fork", "num_workers=0", THREADS[0], "safeloader"]
    for name, entry in contenders.items():
        assert entry["status"] == "ok" and entry["correct"], (name, entry)
        assert 0 < entry["first_batch_s"] <= entry["median"], (name, entry)
        assert entry["first_batch_ratio_to_safeloader"] > 0, (name, entry)
    assert contenders["safeloader"]["first_batch_ratio_to_safeloader"] == pytest.approx(1.0)
    assert "first batch" in result.stdout


class Squares(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 7 and getattr(self, "fail", False):
            raise ValueError("item 7")
        return torch.tensor([index, index * index])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("loader", [ThreadPoolLoader, SpdlLoader])
def test_thread_contenders_yield_torchs_items_and_stop_on_an_item_that_raises(loader):
    generator = torch.Generator().manual_seed(0)
    got = list(loader(Squares(), batch_size=3, num_workers=2, shuffle=True, generator=generator))
    assert [len(batch) for batch in got] == [3, 3, 3, 1]
    expected = torch.cat(list(DataLoader(Squares(), batch_size=3)))
    assert sorted(map(tuple, torch.cat(got).tolist())) == sorted(map(tuple, expected.tolist()))
    failing = Squares()
    failing.fail = True  # an item that raises must fail the epoch, never be dropped (a wrong checksum at best)
    with pytest.raises(Exception):  # noqa: B017  (ValueError from the pool, SPDL's PipelineFailure)
        list(loader(failing, batch_size=3, num_workers=2))


def test_first_start_interval_brackets_the_median_and_only_a_straddling_interval_is_indistinguishable():
    from benchmarks.bench_first_start import bootstrap_interval, verdict

    ratios = [1.02, 0.98, 1.05, 1.01, 0.97, 1.03, 1.00, 0.99, 1.04, 1.02, 0.96, 1.01, 1.00, 1.03, 0.98]
    low, high = bootstrap_interval(ratios)
    assert low <= sorted(ratios)[len(ratios) // 2] <= high
    assert min(ratios) <= low < high <= max(ratios)
    assert verdict(low, high, 1.10) == "not distinguishable from 1.0"
    slower = [r + 0.2 for r in ratios]
    assert verdict(*bootstrap_interval(slower), 1.10) == "above 1.10x"
    assert verdict(*bootstrap_interval([r + 0.05 for r in ratios]), 1.10) == "within 1.10x"
