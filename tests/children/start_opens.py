"""Which library files a loader start opens, in a parent with live native pools.

argv: ``attributed`` (torch's OpenMP and numpy's OpenBLAS threads live: every native thread
waits in a library safeloader knows) or ``unhandled`` (polars' rayon/tokio threads live and
the polars backend disabled for the loader: a pool nobody resets, which the start must read).
Prints one JSON line: {"foreign": <native threads>, "opened": [<.so files opened>], "warned": bool}.
"""

import json
import sys
import warnings

import numpy as np
import torch

import safeloader

mode = sys.argv[1]
torch.set_num_threads(2)
(torch.ones(600, 600) @ torch.ones(600, 600)).sum()  # torch's OpenMP pool
np.ones((300, 300)) @ np.ones((300, 300))  # numpy's OpenBLAS pool
options = {}
if mode == "unhandled":
    import polars as pl

    pl.DataFrame({"a": list(range(1000))}).select(pl.col("a").sum())  # polars' rayon pool and tokio runtime
    options = {"disable_hooks": {"polars"}, "on_unsafe_fork": "warn"}  # forked anyway: the check is what this measures

opened = []


def audit(event, args):
    if event == "open" and isinstance(args[0], str) and ".so" in args[0]:
        opened.append(args[0])


sys.addaudithook(audit)
foreign = len(safeloader.native.thread_census().foreign)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = safeloader.DataLoader(list(range(8)), batch_size=4, num_workers=2, **options)
    batches = [batch.tolist() for batch in loader]
assert batches == [[0, 1, 2, 3], [4, 5, 6, 7]], batches
warned = any(issubclass(w.category, safeloader.UnsafeForkWarning) for w in caught)
print(json.dumps({"foreign": foreign, "opened": sorted(set(opened)), "warned": warned}))
