"""polars in forked workers, after the parent used polars' pool (children/polars_setup.py).

argv: the scenario, then its arguments:
  torch TMP                  torch's loader over Files: prints the items (it hangs instead)
  safeloader TMP DATASET     safeloader's loader over Files or Inherited: prints "ok" if it matches a direct read
  lazy TMP                   a LazyFrame on an in-memory frame: prints "refused" once the error names the fix
  stall-report TMP           the polars backend off: prints the stall report
  unsafe-fork TMP OPTIONS    the polars backend off, the loader's other keywords as JSON: prints the
                             UnsafeForkWarnings, then "FORKED"/"NOT FORKED" or "STALLED: <report>"
  never-started              the parent never started the pool: prints the items
  doctor                     safeloader.doctor() names polars' pool, handled or not: prints "ok"
"""

import json
import os
import sys
import time
import warnings

import numpy as np
import polars as pl
import torch
from torch.utils.data import Dataset

import safeloader
from safeloader.backends import polars as backend
from tests.children import polars_setup


def check(worker_id):
    assert backend.worker_runtime() == "copy", backend.worker_runtime()
    assert pl.thread_pool_size() == 1, pl.thread_pool_size()  # the worker's own pool, of thread_budget threads


def torch_files():
    from torch.utils.data import DataLoader

    print(list(DataLoader(polars_setup.Files(), batch_size=None, num_workers=2)))


def safeloader_reads(dataset):
    ds = {"Files": polars_setup.Files, "Inherited": polars_setup.Inherited}[dataset]()
    expected = [ds[i] for i in range(len(ds))]
    got = list(safeloader.DataLoader(ds, batch_size=None, num_workers=2, thread_budget=1, worker_init_fn=check))
    assert got == list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)) == expected, (got, expected)
    print("ok")


class Lazy(Dataset):
    def __init__(self):
        self.lazy = polars_setup.frame.lazy().filter(pl.col("k") > 3)

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return self.lazy.collect().height


def lazy():
    start = time.monotonic()
    try:
        list(safeloader.DataLoader(Lazy(), batch_size=None, num_workers=2))
    except Exception as exc:
        text = str(exc)
        assert "PolarsInheritedObjectError" in text and "LazyFrame" in text and ".lazy() in the worker" in text, text
        assert time.monotonic() - start < 10
        print("refused")


def stall_report():
    loader = safeloader.DataLoader(
        polars_setup.Files(), batch_size=None, num_workers=1, stall_timeout=2, disable_hooks=("polars",),
        on_unsafe_fork="warn",  # forked anyway: the stall report is what this shows
    )
    try:
        list(loader)
    except safeloader.WorkerStallError as exc:
        print(str(exc))


def unsafe_fork(tmp, options):
    from tests.children.polars_files import Files as ModuleFiles

    ds = ModuleFiles(tmp)
    expected = [ds[i][0] for i in range(4)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = safeloader.DataLoader(ds, batch_size=None, num_workers=2, disable_hooks=("polars",), **options)
        try:
            got = list(loader)
        except safeloader.WorkerStallError as exc:
            got = None
            print("STALLED:", exc)
    print("WARNINGS", [str(w.message) for w in caught if issubclass(w.category, safeloader.UnsafeForkWarning)])
    if got is not None:
        assert [value for value, _ in got] == expected, (got, expected)
        print("FORKED" if all(ppid == os.getpid() for _, ppid in got) else "NOT FORKED")


class Small(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        assert backend.worker_runtime() == "inherited"
        return int(pl.DataFrame({"a": [i, i + 1, i]}).group_by("a").len().height)


def never_started():
    assert not backend.pools_live()
    print(list(safeloader.DataLoader(Small(), batch_size=None, num_workers=2)))


def polars_hazards():
    return [h for h in safeloader.doctor(file=None)["live_at_fork"] if "polars' rayon pool" in h["what"]]


def doctor():
    pl.DataFrame({"a": np.arange(100_000) % 7}).group_by("a").len()
    found = polars_hazards()
    assert len(found) == 1 and found[0]["handled"] and "polars-0" in found[0]["what"], found
    safeloader.disable("polars")
    found = polars_hazards()
    assert not found[0]["handled"] and "on_unsafe_fork='forkserver'" in found[0]["safeloader_will"], found
    print("ok")


def main():
    scenario, *args = sys.argv[1:]
    if scenario == "never-started":
        return never_started()
    if scenario == "doctor":
        return doctor()
    tmp, *rest = args
    polars_setup.setup(tmp)
    if scenario == "torch":
        torch_files()
    elif scenario == "safeloader":
        safeloader_reads(*rest)
    elif scenario == "lazy":
        lazy()
    elif scenario == "stall-report":
        stall_report()
    elif scenario == "unsafe-fork":
        unsafe_fork(tmp, json.loads(rest[0]))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":  # forkserver workers run this file again as __mp_main__
    main()
