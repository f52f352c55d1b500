"""The GPU warm-start finding of docs/benchmarks.md, looked into: `python scripts/gpu_warm_start_probe.py [--pairs 10]`.

On an H100 machine (16 cores, torch 2.11+cu130, Python 3.12) warm starts of a CUDA parent were 1.6-1.9x
torch's fork loader with this Dataset (a tensor, the index and ``os.getppid()`` per item) and 1.04-1.09x
with a Dataset of one tensor and the index. Cause (found with this probe, 2026-11-26): the workers' threads
slept in the kernel's ``expand_files``/``synchronize_rcu``: the CUDA parent holds 46 descriptors of a
64-slot table, and safeloader's two stack files (the watchdog's memfds) made each worker's own descriptors
pass 64 with its feeder thread running; growing the table in a process with threads waits for an RCU grace
period. Fixed by growing each worker's table right after the fork (safeloader/_fd_table.py).

Prints, as JSON lines: the warm-start ratio (alternating pairs) for this Dataset and for the one-tensor
Dataset, with every hook on and with every hook off; then, for two starts of each loader, the state of
every thread of the parent and of the workers while the parent waited for the first batch, sampled
every millisecond (its name, runnable or asleep and in which kernel function: /proc/<pid>/task/<tid>/stat
and wchan), the milliseconds each thread ran and waited for a CPU (schedstat), with the machine's count of
runnable threads and the CPUs each process may run on. A CUDA parent when torch has a GPU; runs (without
CUDA) anywhere else.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import threading
import time
import warnings

import numpy as np
import torch

warnings.simplefilter("ignore")
if torch.cuda.is_available():
    model = torch.nn.Linear(256, 256).cuda()
    model(torch.randn(64, 256, device="cuda")).sum().item()  # CUDA initialised, its threads live
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's safeloader
import safeloader  # noqa: E402

ALL_HOOKS = ["watchdog", "forkstate", "zarrs", "polars", "sockets", "files", "h5py", "lmdb", "fsspec",
             "threadpools", "executors", "torch", "gc", "pin_memory", "blosc2", "pyav"]


THREADING_VARIABLES = ("OMP_", "GOMP_", "KMP_", "OPENBLAS", "MKL_")  # thread counts, CPU binding


class Arrays(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return torch.from_numpy(rng.standard_normal(256).astype(np.float32)), i, os.getppid()


class OneTensor(Arrays):
    def __getitem__(self, i):
        return torch.ones(256), i


def each_thread(pids: list[int]):
    """(n, tid, {file: text}) for each thread of these processes now (n: 0 for the parent, i for worker i),
    with the texts of its /proc/<pid>/task/<tid>/ files stat, wchan, schedstat and comm; threads gone skipped."""
    for n, pid in enumerate(pids):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            texts = {}
            try:
                for name in ("stat", "wchan", "schedstat", "comm"):
                    with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                        texts[name] = f.read().strip()
            except OSError:
                continue
            yield n, tid, texts


def thread_states(pids: list[int]) -> list[str]:
    """'<process>:<thread name>:<state>:<wchan>' for each thread of these processes now (state R: runnable, waiting
    for a CPU or running; S/D: asleep, wchan the kernel function it sleeps in), and the machine's
    runnable thread count ('machine:procs_running:<n>', from /proc/stat)."""
    found = []
    for n, _, texts in each_thread(pids):
        state, wchan = texts["stat"][texts["stat"].rindex(")") + 2], texts["wchan"] or "-"
        found.append(f"{'parent' if n == 0 else 'worker'}:{texts['comm']}:{state}:{wchan if state != 'R' else '-'}")
    with open("/proc/stat") as f:
        running = next(line.split()[1] for line in f if line.startswith("procs_running"))
    found.append(f"machine:procs_running:{running}")
    return found


def run_and_wait_ns(pids: list[int]) -> dict[str, tuple[int, int]]:
    """'<process>:<thread name>:<tid>' -> (ns it ran on a CPU, ns it waited runnable for one), from
    /proc/<pid>/task/<tid>/schedstat: waiting for a CPU shows in the second number, sleeping in neither."""
    found = {}
    for n, tid, texts in each_thread(pids):
        ran, waited = (int(x) for x in texts["schedstat"].split()[:2])
        found[f"{'parent' if n == 0 else 'worker' + str(n)}:{texts['comm']}:{tid}"] = (ran, waited)
    return found


def first_batch(kind: str, dataset=Arrays, kw=None, sample: bool = False):
    loader = safeloader.DataLoader if kind == "safeloader" else torch.utils.data.DataLoader
    extra = (kw or {}) if kind == "safeloader" else {}
    start = time.perf_counter()
    it = iter(loader(dataset(), batch_size=8, num_workers=4, multiprocessing_context="fork", **extra))
    seen: collections.Counter[str] = collections.Counter()
    samples = [0]
    done = threading.Event()

    pids = [os.getpid()] + [w.pid for w in it._workers]
    affinity = [len(os.sched_getaffinity(pid)) for pid in pids]  # CPUs each may run on (inherited at fork)

    def sampler() -> None:
        while not done.is_set():
            seen.update(thread_states(pids))
            samples[0] += 1
            time.sleep(0.001)

    thread = threading.Thread(target=sampler) if sample else None
    before = run_and_wait_ns(pids) if sample else {}
    if thread is not None:
        thread.start()
    next(it)
    elapsed = time.perf_counter() - start
    done.set()
    if thread is not None:
        thread.join()
        after = run_and_wait_ns(pids)
        for key, (ran, waited) in after.items():  # ms each thread ran and waited for a CPU until the batch came
            ran0, waited0 = before.get(key, (0, 0))
            if ran - ran0 > 200_000 or waited - waited0 > 200_000:
                seen[f"cpu_ms {key} ran {(ran - ran0) / 1e6:.1f} waited {(waited - waited0) / 1e6:.1f}"] = 1
    del it
    seen.update({f"affinity:parent {affinity[0]} workers {affinity[1:]}": 1})
    return elapsed, samples[0], seen


def ratio(name: str, dataset, kw=None, pairs: int = 10) -> None:
    first_batch("safeloader", dataset, kw), first_batch("torch", dataset, kw)
    rows = [(first_batch("safeloader", dataset, kw)[0], first_batch("torch", dataset, kw)[0]) for _ in range(pairs)]
    print(json.dumps({"config": name, "median_ratio": round(statistics.median(s / t for s, t in rows), 3),
                      "safeloader_ms": round(statistics.median(s for s, _ in rows) * 1e3, 1),
                      "torch_ms": round(statistics.median(t for _, t in rows) * 1e3, 1)}), flush=True)


def main() -> None:
    pairs = int(sys.argv[sys.argv.index("--pairs") + 1]) if "--pairs" in sys.argv else 10
    print(json.dumps({"torch": torch.__version__, "python": sys.version.split()[0], "cores": os.cpu_count(),
                      "affinity": len(os.sched_getaffinity(0)),
                      "env": {k: v for k, v in os.environ.items() if k.startswith(THREADING_VARIABLES)},
                      "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))
    ratio("three_tensors", Arrays, pairs=pairs)
    ratio("one_tensor", OneTensor, pairs=pairs)
    ratio("three_tensors_every_hook_off", Arrays, {"disable_hooks": ALL_HOOKS, "stall_timeout": None,
                                                   "on_unsafe_fork": "ignore"}, pairs=pairs)
    for kind in ("safeloader", "torch", "safeloader", "torch"):
        elapsed, samples, seen = first_batch(kind, sample=True)
        print(json.dumps({"thread_states_while_waiting": kind, "ms": round(elapsed * 1e3, 1), "samples": samples,
                          "threads": dict(seen.most_common(60))}), flush=True)


if __name__ == "__main__":
    main()
