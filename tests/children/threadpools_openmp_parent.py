"""Loaders started after the parent ran an OpenMP parallel region with 2 threads.

argv: the scenario, then "no-pause" to run it as with a libgomp that has no omp_pause_resource_all
(older than GCC 9), whose pool safeloader cannot release before the fork.
  budgeted            safeloader, thread_budget=2: prints the items and the parent's pools, as JSON
  naive-torch         torch's loader, threadpoolctl giving each worker 2 threads: prints "finished"
  more-threads        safeloader, a worker_init_fn raising torch's threads to 2: prints the error, as JSON
  more-threads-torch  the same under torch's loader: prints "finished"
"""

import json
import sys

import threadpoolctl
import torch

import safeloader
from tests.children.threadpool_report import Report, openmp_team_size, pools, run

torch.set_num_threads(2)
parent_team = openmp_team_size()
(torch.ones(3000, 3000) * 3).sum()  # a torch op on a large tensor with 2 threads
assert parent_team == 2, parent_team

scenario = sys.argv[1]
if sys.argv[2:] == ["no-pause"]:
    from safeloader import forkstate
    from safeloader.backends import _gomp_pause

    for path in forkstate.snapshot(pools=False).gomp_loaded:
        _gomp_pause._pause_of[path] = None  # as found in a copy without the symbol
if scenario == "budgeted":
    before = pools()
    items = run(safeloader.DataLoader(Report(), batch_size=None, num_workers=2, thread_budget=2))
    print(json.dumps({"items": items, "before": before, "after": pools()}))
elif scenario == "naive-torch":

    def naive_budget(worker_id):
        threadpoolctl.threadpool_limits(2)

    run(torch.utils.data.DataLoader(Report(), batch_size=None, num_workers=2, worker_init_fn=naive_budget))
    print("finished")
elif scenario == "more-threads":

    def more_threads(worker_id):
        torch.set_num_threads(2)

    try:
        run(safeloader.DataLoader(Report(), batch_size=None, num_workers=1, worker_init_fn=more_threads))
    except RuntimeError as exc:
        print(json.dumps(str(exc)))
    else:
        print(json.dumps("no error"))
elif scenario == "more-threads-torch":
    run(
        torch.utils.data.DataLoader(
            Report(), batch_size=None, num_workers=1, worker_init_fn=lambda worker_id: torch.set_num_threads(2)
        )
    )
    print("finished")
else:
    raise SystemExit(f"unknown scenario {scenario!r}")
