"""A loader whose parent starts torch's OpenMP pool between the forks of its first and second worker.

Each worker reports its parent's fork-time record (``forkstate.parent_state()``) and its
OpenMP thread count, as JSON: ``{worker_id: [gomp_unsafe is not empty, openmp threads]}``.
"""

import json
import sys

import torch

import safeloader
from safeloader import forkstate
from tests.children.threadpool_report import openmp_team_size

torch.set_num_threads(2)
started = []


def start_openmp_after_first_fork() -> None:
    if not started:  # after worker 0's fork, before worker 1's: torch's libgomp starts its pool threads
        started.append(True)
        (torch.ones(2000, 2000) * 3).sum()


safeloader.register_at_fork(after_in_parent=start_openmp_after_first_fork, name="test.openmp")


class Report(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[int, bool, int]:
        worker = torch.utils.data.get_worker_info().id
        return worker, bool(forkstate.parent_state().gomp_unsafe), openmp_team_size()


loader = safeloader.DataLoader(Report(), batch_size=None, num_workers=2, thread_budget=2)
print(json.dumps({worker: [unsafe, team] for worker, unsafe, team in loader}))
sys.stdout.flush()
