"""What a worker's after_in_child hook sees of the fork counter and the parent's state.

Run with SAFELOADER_DISABLE_NATIVE=1 for the pure-Python fallback, without it for the
C extension. Prints one JSON line: ``native``, the parent's fork generation, and, read
inside the worker's hook, its fork generation and whether ``parent_state()`` was found.
"""

import json

from torch.utils.data import Dataset

import safeloader
from safeloader import DataLoader, forkstate, native

seen = {}


def probe():
    seen["generation"] = native.fork_generation()
    seen["parent_state"] = forkstate.parent_state() is not None


# last=True: after_in_child runs last of the hooks, every built-in one before it.
safeloader.register_at_fork(after_in_child=probe, name="probe", last=True)


class Probed(Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, i):
        return json.dumps(seen)


[batch] = DataLoader(Probed(), num_workers=1, batch_size=None, multiprocessing_context="fork")
print(json.dumps({"native": safeloader.NATIVE, "parent": native.fork_generation(), **json.loads(batch)}))
