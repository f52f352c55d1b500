"""Which library files a loader start opens, in a parent with live native pools.

argv: ``attributed`` (torch's OpenMP and numpy's OpenBLAS threads live: every native thread
waits in a library safeloader knows) or ``unhandled`` (polars' rayon/tokio threads live and
the polars backend disabled for the loader: a pool nobody resets, which the start must read).
Prints one JSON line: {"foreign": <native threads>, "opened": [<.so files opened>], "warned": bool,
"stoppable": [<OpenBLAS files whose threads a start may stop>], "opened_again": [<.so files opened by a
second start, right after another BLAS call>]}.
"""

import json
import sys
import warnings

import numpy as np
import torch

import safeloader
from safeloader import forkstate
from safeloader.backends import threadpools

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
first = sorted(set(opened))
opened.clear()
np.ones((300, 300)) @ np.ones((300, 300))  # its threads spin again at the second start
assert [batch.tolist() for batch in safeloader.DataLoader(list(range(8)), batch_size=4, num_workers=2, **options)] \
    == batches
pools = threadpools.BACKEND._pools.pools(forkstate.loaded_libraries())
stoppable = sorted(pool.path for pool in pools if pool.stop_servers is not None)
print(json.dumps({"foreign": foreign, "opened": first, "warned": warned, "stoppable": stoppable,
                  "opened_again": sorted(set(opened))}))
