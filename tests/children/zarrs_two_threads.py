"""Two loaders of different zarrs modes starting workers from two threads at once: each keeps its
own mode. argv: the array's path. Prints, as JSON, the modes each loader's worker reported."""

import json
import sys
import threading

import numpy as np  # noqa: F401
import torch
import zarr
import zarrs  # noqa: F401

import safeloader
from safeloader.backends import zarrs as backend

zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
zarr.open_array(sys.argv[1], mode="r")[:]  # the parent decodes: arms the deadlock


class ModeOfWorker(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        return backend.worker_mode()


loaders = {
    mode: safeloader.DataLoader(ModeOfWorker(), batch_size=None, num_workers=1, zarrs_mode=mode, timeout=30)
    for mode in ("serial", "python")
}
both_decided = threading.Barrier(len(loaders), timeout=2)


def after_zarrs_decided():
    # Runs after the zarrs hook's `before` (first=True: last in that phase);
    # each thread tries to wait until the other thread's zarrs hook decided too. The
    # registry's fork guard now serialises worker forks across threads, so the wait
    # times out and the forks do not interleave; each loader must still get its mode.
    context = safeloader.fork_context()
    if context is not None and any(context.loader is loader for loader in loaders.values()):
        try:
            both_decided.wait()
        except threading.BrokenBarrierError:
            pass


safeloader.register_at_fork(before=after_zarrs_decided, name="test-interleave", first=True)
seen = {}


def run(mode):
    try:
        seen[mode] = list(loaders[mode])
    except Exception as exc:
        seen[mode] = repr(exc)


threads = [threading.Thread(target=run, args=(mode,)) for mode in loaders]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(60)
print(json.dumps(seen, sort_keys=True))
