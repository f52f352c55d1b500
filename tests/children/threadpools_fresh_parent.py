"""Loaders started from a parent that never ran an OpenMP parallel region: prints, as JSON, what
each loader's workers report, and the parent's pools before and after."""

import json

import torch

import safeloader
from tests.children.threadpool_report import Report, pools, run

out = {"parent_before": pools(), "torch_before": torch.get_num_threads()}
out["default"] = run(safeloader.DataLoader(Report(), batch_size=None, num_workers=2))
out["per_loader"] = run(safeloader.DataLoader(Report(), batch_size=None, num_workers=2, thread_budget=2))
previous = safeloader.configure(thread_budget=2)
out["configured"] = run(safeloader.DataLoader(Report(), batch_size=None, num_workers=2))
safeloader.configure(thread_budget=previous.thread_budget)
out["disabled"] = run(
    safeloader.DataLoader(Report(), batch_size=None, num_workers=2, disable_hooks={"threadpools"})
)
out["torch"] = run(torch.utils.data.DataLoader(Report(), batch_size=None, num_workers=2))
out["parent_after"] = pools()
out["torch_after"] = torch.get_num_threads()
print(json.dumps(out))
