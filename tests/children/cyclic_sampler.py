"""A sampler whose ``__iter__`` builds and drops a throw-away structure of many small reference
cycles (torch draws the first indices inside ``iter(loader)``).

argv: ``torch`` or ``safeloader`` (whose DataLoader) and the number of cycles. Prints JSON:
whether gc was enabled in ``__iter__``, how many collections ran while it built the cycles, how
many MB the process's peak RSS grew over the start, and the epoch's batches.
"""

import gc
import json
import resource
import sys

import torch

LOADER, CYCLES = sys.argv[1], int(sys.argv[2])
if LOADER == "torch":
    from torch.utils.data import DataLoader
else:
    from safeloader import DataLoader

seen = {"enabled": None, "collections": 0}


def count_collections(phase, info):
    if phase == "start":
        seen["collections"] += 1


class CyclicSampler(torch.utils.data.Sampler):
    def __len__(self) -> int:
        return 8

    def __iter__(self):
        seen["enabled"] = gc.isenabled()
        gc.callbacks.append(count_collections)
        for _ in range(CYCLES):  # a node and its list, each pointing at the other: freed only by gc
            node = {"neighbours": []}
            node["neighbours"].append(node)
        gc.callbacks.remove(count_collections)
        yield from range(8)


loader = DataLoader(list(range(8)), batch_size=2, sampler=CyclicSampler(), num_workers=2)
gc.collect()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
iterator = iter(loader)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({
    "gc enabled in __iter__": seen["enabled"],
    "collections": seen["collections"],
    "peak MB grown": round(grown),
    "epoch": [batch.tolist() for batch in iterator],
}))
