"""A worker's thread budget starts no BLAS threads at its fork: the parent's OpenBLAS pool is live,
and workers get a budget below its count (lowered in place) and above it (left as is). Prints, per
loader, each worker's thread count, OpenBLAS count and torch's thread count at its first item,
before any BLAS call (torch's count of n keeps n - 1 threads of its own pool)."""

import json
import os
import sys

import numpy
import threadpoolctl
import torch

import safeloader


def openblas_threads():
    return next(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas")


class Threads(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        return json.dumps([len(os.listdir("/proc/self/task")), openblas_threads(), torch.get_num_threads()])


def main():
    matrix = numpy.ones((400, 400))
    matrix @ matrix  # the parent's OpenBLAS pool is started
    parent = openblas_threads()
    loaders = {
        "torch": torch.utils.data.DataLoader(Threads(), batch_size=None, num_workers=2),
        "below": safeloader.DataLoader(Threads(), batch_size=None, num_workers=2, thread_budget=1),
        "above": safeloader.DataLoader(Threads(), batch_size=None, num_workers=2, thread_budget=parent + 2),
    }
    report = {name: [json.loads(item) for item in loader] for name, loader in loaders.items()}
    print(json.dumps({"parent": parent, **report}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
