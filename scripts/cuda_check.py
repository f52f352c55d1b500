"""The CUDA paths, checked for real on a machine with a GPU (CI has none): `python scripts/cuda_check.py`.

Each case runs in a fresh interpreter under a deadline (a hang is a failure, with the child's
output), once with safeloader and once with torch's own loader, and prints one JSON line per case:

- pinned: a CUDA parent (a model's weights on the GPU, a kernel run, so CUDA's driver threads are
  live at the fork) with forked workers and pin_memory=True. Every batch must be pinned, equal
  value for value to a direct read, and its copy to the GPU right. No warning may be raised (an
  unattributed CUDA thread would make the default on_unsafe_fork="auto" switch to forkserver) and
  the workers must be forked from this process.
- worker_uses_cuda: the Dataset touches CUDA in the worker. torch: its "Cannot re-initialize CUDA"
  error; safeloader: ForkedAcceleratorError naming the worker and the remedies.
- installed_two_loaders: safeloader.install(), two persistent loaders with pin_memory alternating
  (each start forks while the other's pin-memory thread pins batches).
- start_ratio: warm starts in a CUDA parent, safeloader / torch's fork loader, alternating pairs.
- first_start_ratio: the first start of fresh CUDA processes, safeloader and torch alternating.
- fast_forks: a start's later worker forks in a CUDA parent take the C path (csrc/fast_fork.c): the
  registry's Python path runs at each start's first fork only, and the pinned batches are right.
- doctor: safeloader.doctor() in a CUDA parent: nothing live may be reported as breaking or unknown.

Exit status 0 when every case holds. Needs torch with CUDA and a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PRELUDE = """
import json, os, sys, time, warnings
import numpy as np
import torch
warnings.simplefilter("always")
caught = []
EXPECTED = (
    "suggested max number of worker",  # torch's, on a machine with few cores
    "use of fork() may lead to deadlocks",  # Python 3.12+ at every fork of a process with threads (CUDA's)
)


def keep(message, category, *rest):
    if not any(text in str(message) for text in EXPECTED):  # the same for torch's loader and safeloader
        caught.append(f"{category.__name__}: {message}")
warnings.showwarning = keep
assert torch.cuda.is_available(), "no GPU"
model = torch.nn.Linear(256, 256).cuda()
model(torch.randn(64, 256, device="cuda")).sum().item()  # CUDA initialised, kernels run
import safeloader
LOADER = {"safeloader": safeloader.DataLoader, "torch": torch.utils.data.DataLoader}[sys.argv[1]]

class Arrays(torch.utils.data.Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return torch.from_numpy(rng.standard_normal(256).astype(np.float32)), i, os.getppid()

def direct():
    return torch.stack([Arrays()[i][0] for i in range(len(Arrays()))])
"""

CASES = {
    "pinned": """
expected = direct()
loader = LOADER(Arrays(), batch_size=16, num_workers=4, pin_memory=True, multiprocessing_context="fork")
result = {"epochs": 0}
for epoch in range(2):
    seen = torch.zeros(len(Arrays()), 256)
    for batch, index, ppid in loader:
        assert batch.is_pinned(), "a batch is not pinned"
        assert set(ppid.tolist()) == {os.getpid()}, f"workers not forked from the parent: {set(ppid.tolist())}"
        on_gpu = batch.to("cuda", non_blocking=True)
        out = model(on_gpu)
        torch.cuda.synchronize()
        assert torch.equal(on_gpu.cpu(), batch)
        seen[index] = batch
    assert torch.equal(seen, expected), "data differs from a direct read"
    result["epochs"] += 1
result["warnings"] = caught
assert not caught, caught
print(json.dumps(result))
""",
    "worker_uses_cuda": """
class UsesCuda(Arrays):
    def __getitem__(self, i):
        return torch.ones(1, device="cuda")
try:
    next(iter(LOADER(UsesCuda(), batch_size=2, num_workers=2)))
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "message": str(exc)[-600:]}))
""",
    "installed_two_loaders": """
safeloader.install()
expected = direct()
loaders = [torch.utils.data.DataLoader(Arrays(), batch_size=8, num_workers=2, pin_memory=True,
                                       persistent_workers=True, shuffle=True) for _ in range(2)]
for epoch in range(3):
    iterators = [iter(loader) for loader in loaders]
    for pair in zip(*iterators):
        for batch, index, ppid in pair:
            assert batch.is_pinned()
            assert torch.equal(batch.to("cuda").cpu(), expected[index])
print(json.dumps({"epochs": 3, "warnings": caught}))
assert not caught, caught
""",
    "start_ratio": """
import statistics
loaders = {"safeloader": safeloader.DataLoader, "torch": torch.utils.data.DataLoader}
def first_batch(kind):
    t = time.perf_counter()
    it = iter(loaders[kind](Arrays(), batch_size=8, num_workers=4, multiprocessing_context="fork"))
    next(it)
    elapsed = time.perf_counter() - t
    del it
    return elapsed
first = {kind: first_batch(kind) for kind in ("safeloader", "torch")}
ratios = []
for _ in range(15):
    ratios.append(first_batch("safeloader") / first_batch("torch"))
print(json.dumps({"first_start_s": first, "warm_median_ratio": statistics.median(ratios),
                  "warm_ratios": sorted(round(r, 3) for r in ratios), "warnings": caught}))
""",
    "first_start": """
# The first loader start of this fresh process (CUDA initialised, a model on the GPU), to its first batch.
t = time.perf_counter()
next(iter(LOADER(Arrays(), batch_size=8, num_workers=4, multiprocessing_context="fork")))
print(json.dumps({"first_start_ms": round((time.perf_counter() - t) * 1e3, 1)}))
""",
    "fast_forks": """
# A start's later worker forks in a CUDA parent (CUDA's driver threads live) take the C path:
# the registry's Python path runs at each start's first fork only, and the pinned data is right.
from safeloader import _registry
python_path = []
_recognise = _registry._context_for_this_fork
def recognise():
    python_path.append(len(python_path))
    return _recognise()
_registry._context_for_this_fork = recognise
expected = direct()
loader = LOADER(Arrays(), batch_size=8, num_workers=4, pin_memory=True, multiprocessing_context="fork")
per_start = []
for epoch in range(3):
    python_path.clear()
    seen = torch.zeros(len(Arrays()), 256)
    for batch, index, ppid in loader:
        assert batch.is_pinned()
        seen[index] = batch
    assert torch.equal(seen, expected), "data differs from a direct read"
    per_start.append(len(python_path))
print(json.dumps({"python_path_forks_per_start": per_start, "warnings": caught}))
assert per_start == [1, 1, 1], per_start
assert not caught, caught
""",
    "doctor": """
report = safeloader.doctor(file=None)
live = [{"status": h["status"], "what": h["what"]} for h in report["live_at_fork"]]
print(json.dumps({"live_at_fork": live, "summary": report["summary"],
                  "native_threads": report["process"]["native_threads"]}))
assert not [h for h in live if h["status"] in ("breaks", "unknown")], live
""",
}
ONLY_SAFELOADER = {"start_ratio", "doctor", "fast_forks"}
SEPARATE = {"first_start"}  # run in pairs by first_start_ratio


def run(case: str, kind: str, deadline: float = 120.0) -> dict[str, object]:
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(CASES[case])
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, kind], capture_output=True, text=True, timeout=deadline, start_new_session=True
        )
    except subprocess.TimeoutExpired as exc:
        return {"case": case, "kind": kind, "ok": False, "hung": deadline, "output": str(exc.stdout)[-2000:]}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result: dict[str, object] = {"case": case, "kind": kind, "ok": done.returncode == 0 and bool(lines)}
    if lines:
        result.update(json.loads(lines[-1]))
    if not result["ok"]:
        result["stderr"] = done.stderr[-3000:]
    return result


def first_start_ratio(pairs: int = 5) -> dict[str, object]:
    """Fresh processes, safeloader and torch alternating: the median of safeloader / torch per pair."""
    import statistics

    ratios, times = [], {"safeloader": [], "torch": []}
    for _ in range(pairs):
        pair = {kind: run("first_start", kind).get("first_start_ms") for kind in ("safeloader", "torch")}
        if None in pair.values():
            return {"case": "first_start_ratio", "ok": False, "pair": pair}
        for kind, ms in pair.items():
            times[kind].append(ms)
        ratios.append(pair["safeloader"] / pair["torch"])
    return {"case": "first_start_ratio", "ok": True, "median_ratio": round(statistics.median(ratios), 3),
            "ms": times}


def main() -> int:
    import torch

    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
                      "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))
    failed = 0
    for case in [case for case in CASES if case not in SEPARATE]:
        for kind in ("safeloader",) if case in ONLY_SAFELOADER else ("safeloader", "torch"):
            result = run(case, kind)
            if case == "worker_uses_cuda":  # both loaders must fail it, each with its own error
                wanted = "ForkedAcceleratorError" if kind == "safeloader" else "RuntimeError"
                result["ok"] = result.get("raised") == wanted
            failed += not result["ok"]
            print(json.dumps(result), flush=True)
    result = first_start_ratio()
    failed += not result["ok"]
    print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
