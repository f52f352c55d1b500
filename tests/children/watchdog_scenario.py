"""A worker deadlock, under safeloader's DataLoader (with its stall watchdog) or torch's.

argv: the scenario, ``lock``, ``gil`` or ``zarrs``; the loader, ``safeloader`` or ``torch``;
for safeloader: stall_timeout, and the loader's other keyword arguments as JSON.

lock: a lock held by a parent thread at the moment of the fork: in the workers it
is held forever (the holder does not exist there). Item 0 and 1 (one per worker)
are served, so the stall hits an item after the first one.

gil: a worker deadlocks holding its GIL (a native call that keeps it, on a mutex the parent held at
the fork) in the item after one it sent, while the main process is busy with a step: the main
thread then reads the sent item, whose tensor it must fetch from that worker (its resource-sharer
thread, which needs the GIL): it waits inside torch's receive, not between two waits.

zarrs: the user's case: the parent decodes a compressed zarr array through zarrs,
then forked workers read slices spanning many chunks: rayon's pool has no threads
in the child, the decode waits forever.

safeloader prints ``NO ERROR``, or ``ELAPSED <seconds>`` and the error between
``MESSAGE-BEGIN`` and ``MESSAGE-END``; then ``LEFTOVER <child pids>``. torch prints
``batch`` per batch and ``TORCH DONE`` if its loader ever finishes.
"""

import ctypes
import json
import os
import sys
import tempfile
import threading
import time

import psutil
import torch

import safeloader


def lock_scenario():
    lock = threading.Lock()

    class LockedDataset(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            if index >= 2:
                with lock:
                    pass
            return index

    ready, release = threading.Event(), threading.Event()

    def hold_lock():
        with lock:
            ready.set()
            release.wait()

    holder = threading.Thread(target=hold_lock, name="lock-holder")
    holder.start()
    ready.wait()

    def done():
        release.set()
        holder.join()

    return LockedDataset(), done


def gil_scenario():
    libc = ctypes.PyDLL(None)  # PyDLL: its calls keep the GIL, as a native library's may
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)  # held at the fork: locked for ever in every worker

    class GilHeldDataset(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            if index == 4:  # worker 0's third item: its second (2) is sent meanwhile
                time.sleep(0.2)
                libc.pthread_mutex_lock(mutex)
            return index

    return GilHeldDataset(), lambda: libc.pthread_mutex_unlock(mutex)


def zarrs_scenario():
    import numpy as np
    import zarr
    import zarrs  # noqa: F401

    zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
    path = os.path.join(tempfile.mkdtemp(), "volume.zarr")
    written = zarr.create_array(path, shape=(8, 128, 128), chunks=(1, 32, 32), dtype="float32")
    written[:] = np.arange(8 * 128 * 128, dtype="float32").reshape(8, 128, 128)

    class ZarrDataset(torch.utils.data.Dataset):
        def __init__(self, path):
            self.array = zarr.open_array(path, mode="r")

        def __len__(self):
            return self.array.shape[0]

        def __getitem__(self, index):
            return self.array[index : index + 1]

    dataset = ZarrDataset(path)
    dataset[0]  # the parent reads first: rayon's global pool exists from now on
    return dataset, lambda: None


def run_safeloader(dataset, stall, extra):
    loader = safeloader.DataLoader(dataset, num_workers=2, stall_timeout=stall, **extra)
    start = time.monotonic()
    try:
        for _batch in loader:
            time.sleep(STEP)
        print("NO ERROR")
    except safeloader.watchdog.WorkerStallError as error:
        print("ELAPSED", time.monotonic() - start)
        print("MESSAGE-BEGIN")
        print(error)
        print("MESSAGE-END")
    del loader
    leftover = [
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())
    ]
    print("LEFTOVER", leftover)


def run_torch(dataset):
    loader = torch.utils.data.DataLoader(dataset, num_workers=2)
    for _batch in loader:
        print("batch", flush=True)
        time.sleep(STEP)
    print("TORCH DONE")


scenario, which, *options = sys.argv[1:]
dataset, done = {"lock": lock_scenario, "gil": gil_scenario, "zarrs": zarrs_scenario}[scenario]()
STEP = 0.5 if scenario == "gil" else 0.0  # seconds the main process spends on each batch (a training step)
if which == "torch":
    run_torch(dataset)
else:
    stall, extra = options
    run_safeloader(dataset, float(stall), json.loads(extra))
done()
