"""polars in forked workers: torch's workers hang once the parent used polars' pool; safeloader's run it.

Each scenario runs in a child process under a deadline (tests/subproc.py).
The parent runs a group_by on enough rows to start polars' rayon pool, as a
Dataset that prepares its data in ``__init__`` does.
"""

from __future__ import annotations

import pytest

from .subproc import check_python, run_python

pytest.importorskip("polars")  # in the test extra; skipped only where the extra is not installed

SETUP = """
import os, sys, time
import numpy as np
import polars as pl
import torch
from torch.utils.data import Dataset
N = 300_000
frame = pl.DataFrame({{"k": np.arange(N) % 97, "v": np.arange(N)}})
frame.group_by("k").agg(pl.col("v").sum())  # starts polars' pool in the parent
os.makedirs({tmp!r}, exist_ok=True)
for i in range(4):
    frame.slice(i * 1000, 1000).write_parquet(os.path.join({tmp!r}, f"{{i}}.parquet"))

class Files(Dataset):
    def __len__(self): return 4
    def __getitem__(self, i):
        return int(pl.read_parquet(os.path.join({tmp!r}, f"{{i}}.parquet"))["v"].sum())

class Inherited(Dataset):
    # Built in __init__, used in the workers: a DataFrame, a Series, an expression, a file scan.
    def __init__(self):
        self.frame = frame
        self.series = frame["v"]
        self.expr = (pl.col("v") * 2).alias("w")
        self.scan = pl.scan_parquet(os.path.join({tmp!r}, "*.parquet"))
    def __len__(self): return 4
    def __getitem__(self, i):
        part = self.frame.slice(i * 50_000, 50_000).group_by("k").agg(pl.col("v").sum()).sort("k")
        scanned = self.scan.filter(pl.col("k") == i).select(self.expr).collect()
        return [part["v"].to_list(), int(self.series[i * 7]), scanned["w"].to_list()]
"""


@pytest.mark.torch_baseline
def test_torch_workers_hang_after_the_parent_used_polars(tmp_path):
    code = SETUP.format(tmp=str(tmp_path)) + """
from torch.utils.data import DataLoader
print(list(DataLoader(Files(), batch_size=None, num_workers=2)))
"""
    result = run_python(code, timeout=25)
    assert result.timed_out, f"torch's workers were expected to hang on polars' inherited pool:\n{result}"


@pytest.mark.parametrize("dataset", ["Files", "Inherited"])
def test_safeloader_workers_run_polars_and_match_a_direct_read(tmp_path, dataset):
    code = SETUP.format(tmp=str(tmp_path)) + f"""
import safeloader
from safeloader.backends import polars as backend

def check(worker_id):
    assert backend.worker_runtime() == "copy", backend.worker_runtime()
    assert pl.thread_pool_size() == 1, pl.thread_pool_size()  # the worker's own pool, of thread_budget threads

ds = {dataset}()
expected = [ds[i] for i in range(len(ds))]
got = list(safeloader.DataLoader(ds, batch_size=None, num_workers=2, thread_budget=1, worker_init_fn=check))
assert got == list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)) == expected, (got, expected)
print("ok")
"""
    assert "ok" in check_python(code, timeout=90).stdout


def test_lazyframe_on_an_in_memory_frame_fails_at_once_naming_the_fix(tmp_path):
    code = SETUP.format(tmp=str(tmp_path)) + """
import safeloader

class Lazy(Dataset):
    def __init__(self): self.lazy = frame.lazy().filter(pl.col("k") > 3)
    def __len__(self): return 2
    def __getitem__(self, i): return self.lazy.collect().height

start = time.monotonic()
try:
    list(safeloader.DataLoader(Lazy(), batch_size=None, num_workers=2))
except Exception as exc:
    text = str(exc)
    assert "PolarsInheritedObjectError" in text and "LazyFrame" in text and ".lazy() in the worker" in text, text
    assert time.monotonic() - start < 10
    print("refused")
"""
    assert "refused" in check_python(code, timeout=60).stdout


def test_parent_that_never_started_the_pool_keeps_the_inherited_module(tmp_path):
    code = """
import polars as pl, torch, safeloader
from safeloader.backends import polars as backend

class Small(torch.utils.data.Dataset):
    def __len__(self): return 2
    def __getitem__(self, i):
        assert backend.worker_runtime() == "inherited"
        return int(pl.DataFrame({"a": [i, i + 1, i]}).group_by("a").len().height)

assert not backend.pools_live()
print(list(safeloader.DataLoader(Small(), batch_size=None, num_workers=2)))
"""
    assert check_python(code, timeout=60).stdout.strip() == "[2, 2]"


def test_stall_report_names_polars_rayon_pool_when_the_backend_is_off(tmp_path):
    code = SETUP.format(tmp=str(tmp_path)) + """
import safeloader
loader = safeloader.DataLoader(Files(), batch_size=None, num_workers=1, stall_timeout=2, disable_hooks=("polars",))
try:
    list(loader)
except safeloader.WorkerStallError as exc:
    print(str(exc))
"""
    out = check_python(code, timeout=90).stdout
    assert "polars' rayon pool, inherited without its threads" in out, out
    assert "_polars_runtime" in out and "disable_hooks" in out, out  # where it waits, and the fix


def test_doctor_names_polars_pools_and_whether_a_backend_resets_them():
    code = """
import numpy as np, polars as pl, safeloader
pl.DataFrame({"a": np.arange(100_000) % 7}).group_by("a").len()
def polars_hazards():
    return [h for h in safeloader.doctor(file=None)["live_at_fork"] if "polars' rayon pool" in h["what"]]
found = polars_hazards()
assert len(found) == 1 and found[0]["handled"] and "polars-0" in found[0]["what"], found
safeloader.disable("polars")
found = polars_hazards()
assert not found[0]["handled"] and "on_unsafe_fork='forkserver'" in found[0]["safeloader_will"], found
print("ok")
"""
    assert "ok" in check_python(code, timeout=60).stdout


DATASET_MODULE = """
import os
import polars as pl
import torch

class Files(torch.utils.data.Dataset):
    def __init__(self, folder): self.folder = folder
    def __len__(self): return 4
    def __getitem__(self, i):
        frame = pl.read_parquet(os.path.join(self.folder, f"{i}.parquet"))
        return int(frame["v"].sum()), os.getppid()
"""


def _unsafe_fork_code(tmp_path, loader_options):
    (tmp_path / "polars_files.py").write_text(DATASET_MODULE)
    return SETUP.format(tmp=str(tmp_path / "data")) + f"""
import warnings
import safeloader
from polars_files import Files as ModuleFiles
ds = ModuleFiles({str(tmp_path / "data")!r})
expected = [ds[i][0] for i in range(4)]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = safeloader.DataLoader(ds, batch_size=None, num_workers=2, disable_hooks=("polars",), {loader_options})
    try:
        got = list(loader)
    except safeloader.WorkerStallError as exc:
        got = None
        print("STALLED:", exc)
print("WARNINGS", [str(w.message) for w in caught if issubclass(w.category, safeloader.UnsafeForkWarning)])
if got is not None:
    assert [value for value, _ in got] == expected, (got, expected)
    print("FORKED" if all(ppid == os.getpid() for _, ppid in got) else "NOT FORKED")
"""


def test_on_unsafe_fork_forkserver_starts_workers_that_run_a_pool_no_backend_resets(tmp_path):
    # The 'polars' backend is off: polars stands for any Rust library safeloader has no backend for.
    code = _unsafe_fork_code(tmp_path, "on_unsafe_fork='forkserver'")
    result = check_python(code, timeout=120, env={"PYTHONPATH": str(tmp_path)})
    assert "NOT FORKED" in result.stdout and "WARNINGS []" in result.stdout, result


def test_default_warns_at_fork_naming_the_library_and_the_option(tmp_path):
    # Same loader without the option: it forks, warns, and its workers hang in polars' inherited pool.
    code = _unsafe_fork_code(tmp_path, "stall_timeout=2")
    out = check_python(code, timeout=60, env={"PYTHONPATH": str(tmp_path)}).stdout
    warned = out.split("WARNINGS", 1)[1]
    assert warned.count("UnsafeForkWarning") == 0 and "polars' rayon pool and tokio runtime" in warned, out
    assert "on_unsafe_fork='forkserver'" in warned, out
    assert "STALLED:" in out and "polars' rayon pool, inherited without its threads" in out, out
