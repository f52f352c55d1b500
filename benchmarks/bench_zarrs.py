"""zarrs in DataLoader workers: epoch time of each way to decode, side by side, and per-worker set-up cost.

    python -m benchmarks.bench_zarrs [--workers 2] [--rounds 5] [--repeat 8] [--diagnose]

Data: a 4096 x 4096 float32 array (64 MB raw), zstd-compressed, sharded as
OME-Zarr 0.5 writes (512 x 512 shards of 64 x 64 chunks); an item reads a
1024 x 512 block (2 shards, 128 chunks) and returns its sum, so
decoding dominates and every contender's checksum is compared. An epoch reads
the whole array ``--repeat`` times; its time includes the worker start.

Contenders (each in its own process, set up once, one epoch per round,
rounds rotate the order so machine noise hits all alike):

- safeloader pool / serial / python: the parent decoded with zarrs first
  and the Dataset holds the array it opened (the deadlock scenario);
- torch fork, parent never opened: the best case for plain torch, which
  happens not to hang (the array is opened lazily in each worker);
- torch spawn: the parent decoded first; workers unpickle the Dataset;
- zarr-python pipeline, torch fork: zarrs not used at all.

A contender that passes its deadline is recorded as a hang, never waited out.
Then a separate process measures each mode's per-worker set-up cost.
Writes benchmarks/results/zarrs.json (zarrs-diagnose.json with --diagnose).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .child import serve
from .common import print_table, summarize, write_json
from .suite import Child, start_child

ZARRS_PIPELINE = "zarrs.ZarrsCodecPipeline"
PYTHON_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"
SHAPE = (4096, 4096)
CHUNKS = (64, 64)  # inner chunks of
SHARDS = (512, 512)  # shards: one file per 512 x 512 block, as OME-Zarr 0.5 writes them
BLOCK = (1024, 512)
DATA_DIR = Path(os.environ.get("SAFELOADER_BENCH_DATA", "/tmp/safeloader-bench-zarrs"))
DEADLINE = 120.0  # seconds for one epoch: past it, a hang

CONTENDERS = {
    "safeloader pool": "safeloader pool (default), parent read",
    "safeloader serial": "safeloader serial, parent read",
    "safeloader python": "safeloader python, parent read",
    "torch fork unarmed": "torch fork, parent never opened (best case)",
    "torch spawn": "torch spawn, parent read",
    "zarr-python fork": "zarr-python pipeline, torch fork",
}
# --diagnose: where the default mode's time goes.
DIAGNOSTIC_CONTENDERS = {
    "safeloader pool zarrs-only": "safeloader pool, other backends' hooks disabled",
    "safeloader pool all-cores": "safeloader pool, thread_budget=cores (oversubscribed)",
}


def blocks() -> list[tuple[slice, slice]]:
    return [
        (slice(i, i + BLOCK[0]), slice(j, j + BLOCK[1]))
        for i in range(0, SHAPE[0], BLOCK[0])
        for j in range(0, SHAPE[1], BLOCK[1])
    ]


class Blocks(torch.utils.data.Dataset):
    """Item i: the float64 sum of block i % blocks. Opens the array now, or lazily in each worker."""

    def __init__(self, path: str, repeat: int, *, open_now: bool) -> None:
        self.path = path
        self.blocks = blocks() * repeat
        self.array = self._open() if open_now else None

    def _open(self):
        import zarr

        return zarr.open_array(self.path, mode="r")

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> float:
        if self.array is None:
            self.array = self._open()
        return float(self.array[self.blocks[index]].sum(dtype=np.float64))


def make_data(directory: Path) -> tuple[str, float]:
    """The array (made once, then reused) and the checksum of one pass over its blocks."""
    import zarr
    import zarrs  # noqa: F401
    from zarr.codecs import ZstdCodec

    path = directory / f"data-{SHAPE[0]}x{SHAPE[1]}-s{SHARDS[0]}-c{CHUNKS[0]}.zarr"
    rng = np.random.default_rng(0)
    data = np.round(np.cumsum(rng.standard_normal(SHAPE, dtype=np.float32), axis=1), 2).astype(np.float32)
    with zarr.config.set({"codec_pipeline.path": ZARRS_PIPELINE}):
        if not (path / "zarr.json").exists():
            directory.mkdir(parents=True, exist_ok=True)
            array = zarr.create_array(
                str(path),
                shape=SHAPE,
                chunks=CHUNKS,
                shards=SHARDS,
                dtype="f4",
                compressors=ZstdCodec(level=3),
                overwrite=True,
            )
            array[:] = data
    checksum = sum(float(data[block].sum(dtype=np.float64)) for block in blocks())
    return str(path), checksum


# -- one contender, in its own process -----------------------------------------------


def contender_epoch(name: str, path: str, repeat: int, workers: int):
    """Set up ``name`` (imports, the parent's own read) and return a function timing one epoch."""
    import zarr

    pipeline = PYTHON_PIPELINE if name == "zarr-python fork" else ZARRS_PIPELINE
    zarr.config.set({"codec_pipeline.path": pipeline})
    os.environ["ZARR_CODEC_PIPELINE__PATH"] = pipeline  # spawned workers read zarr's config from here
    parent_reads = name != "torch fork unarmed"
    dataset = Blocks(path, repeat, open_now=parent_reads)
    if parent_reads:
        dataset[0]  # the parent's own decode: for zarrs, arms the deadlock
    if name.startswith("safeloader"):
        import safeloader

        mode = name.split()[1]
        options = {}
        if name.endswith("zarrs-only"):
            options["disable_hooks"] = [hook.name for hook in safeloader.hooks() if hook.name != "zarrs"]
        if name.endswith("all-cores"):
            options["thread_budget"] = len(os.sched_getaffinity(0))

        def build():
            return safeloader.DataLoader(dataset, batch_size=None, num_workers=workers, zarrs_mode=mode, **options)
    else:
        context = "spawn" if name == "torch spawn" else "fork"

        def build():
            return torch.utils.data.DataLoader(
                dataset, batch_size=None, num_workers=workers, multiprocessing_context=context
            )

    def epoch() -> dict:
        start = time.perf_counter()
        total = sum(build())  # worker start, every item, worker shutdown
        return {"seconds": time.perf_counter() - start, "checksum": total / repeat}

    return epoch


def child_main(name: str, path: str, repeat: int, workers: int) -> None:
    serve(lambda: contender_epoch(name, path, repeat, workers))


# -- per-worker set-up cost of each mode ------------------------------------------------

SETUP_COSTS = """
import gc, json, os, statistics, sys, time
import zarr, zarrs
zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
import safeloader
from safeloader.backends import zarrs as backend, _zarrs_pipelines

path, forks, arrays = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
opened = [zarr.open_array(path, mode="r") for _ in range(arrays)]  # pipelines the workers inherit
opened[0][:1024, :512]  # the parent decodes: arms the deadlock
start = time.perf_counter()
backend.BACKEND.resolve_mode("pool")  # the parent's one-off checks, copy and load of the spare, as in the first fork
copy_ms = (time.perf_counter() - start) * 1e3

def in_child(mode):
    pool = mode == "pool"
    spare = backend.BACKEND.spare_copy()
    plan = backend.Plan(mode, 1, spare, backend.BACKEND.current_bindings()) if pool else backend.Plan(mode, 1, None)
    start = time.perf_counter()
    backend.BACKEND.after_in_child(None, plan)  # what the hook does at worker start
    setup = time.perf_counter() - start
    start = time.perf_counter()
    for array in opened:  # what each inherited pipeline costs on its first use
        _zarrs_pipelines._prepare(array._async_array.codec_pipeline)
    first_use = (time.perf_counter() - start) / arrays
    start = time.perf_counter()
    found = [o for o in gc.get_objects() if isinstance(o, zarrs.pipeline.ZarrsCodecPipeline)]
    scan = time.perf_counter() - start
    assert len(found) >= arrays
    block = opened[0][1024:2048, 512:1024]  # and it decodes
    return {"setup_ms": setup * 1e3, "first_use_ms_per_pipeline": first_use * 1e3, "heap_scan_ms": scan * 1e3}

results = {}
for mode in ("pool", "serial", "python"):
    samples = []
    for _ in range(forks):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.write(write, json.dumps(in_child(mode)).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            samples.append(json.loads(pipe.read()))
        os.waitpid(pid, 0)
    results[mode] = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
print(json.dumps({"memfd_copy_ms": copy_ms, "arrays": arrays, "forks": forks, "modes": results}))
"""


def setup_costs(path: str, forks: int = 7, arrays: int = 8) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", SETUP_COSTS, path, str(forks), str(arrays)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if result.returncode != 0:
        raise RuntimeError(f"set-up cost measurement failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- driver ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=8, help="passes over the array per epoch")
    parser.add_argument("--diagnose", action="store_true", help="also run " + ", ".join(DIAGNOSTIC_CONTENDERS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child, args.path, args.repeat, args.workers)
        return {}

    began = time.perf_counter()
    path, checksum = make_data(DATA_DIR)
    child_args = ["--path", path, "--repeat", str(args.repeat), "--workers", str(args.workers)]
    labels = {**CONTENDERS, **(DIAGNOSTIC_CONTENDERS if args.diagnose else {})}
    contenders: dict[str, Child] = {}
    try:
        for name in labels:
            print(f"\rstarting {name:<30}", end="", file=sys.stderr, flush=True)
            contenders[name] = start_child(name, "benchmarks.bench_zarrs", "--child", name, *child_args, quiet=False)
            if not contenders[name].ready(time.monotonic() + DEADLINE):
                raise RuntimeError(f"contender {name!r} did not start: {contenders[name].status}")
        samples: dict[str, list[float | None]] = {name: [] for name in labels}
        wrong: dict[str, int] = {name: 0 for name in labels}
        names = list(labels)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                print(f"\rround {round_ + 1}/{args.rounds} {name:<30}", end="", file=sys.stderr, flush=True)
                child = contenders[name]
                result = child.measure(DEADLINE) if child.status == "ok" else None
                if result is None or "seconds" not in result:  # a hang or an error: a failure
                    samples[name].append(None)
                    continue
                samples[name].append(result["seconds"])
                if not np.isclose(result["checksum"], checksum, rtol=1e-9):
                    wrong[name] += 1
        print(file=sys.stderr)
    finally:
        for contender in contenders.values():
            contender.close()
    costs = setup_costs(path)

    results = {
        name: {**summarize(values), "wrong_checksums": wrong[name], "status": contenders[name].status}
        for name, values in samples.items()
    }
    pool = results["safeloader pool"]["median"]

    def ratios_of(statistic: str) -> dict[str, float | None]:
        value = {name: r[statistic] for name, r in results.items()}

        def ratio(a: str, b: str) -> float | None:
            return None if value[a] is None or value[b] is None else value[a] / value[b]

        return {
            "pool_vs_torch_fork_unarmed": ratio("safeloader pool", "torch fork unarmed"),
            "spawn_vs_pool": ratio("torch spawn", "safeloader pool"),
            "zarr_python_fork_vs_pool": ratio("zarr-python fork", "safeloader pool"),
            "serial_vs_pool": ratio("safeloader serial", "safeloader pool"),
            "safeloader_python_vs_pool": ratio("safeloader python", "safeloader pool"),
        }

    ratios, ratios_of_min = ratios_of("median"), ratios_of("min")
    rows = [
        [
            labels[name],
            r["status"].split(":")[0] if r["median"] is None else f"{r['median']:.2f}",
            "-" if r["min"] is None else f"{r['min']:.2f}",
            "-" if r["max"] is None else f"{r['max']:.2f}",
            "-" if r["median"] is None or pool is None else f"{r['median'] / pool:.2f}x",
            f"{r['failures']}/{r['n'] + r['failures']}",
            str(r["wrong_checksums"]),
        ]
        for name, r in results.items()
    ]
    blocks_per_epoch = len(blocks()) * args.repeat
    print(
        f"\nEpoch time, worker start included: {args.workers} workers, {blocks_per_epoch} blocks of "
        f"{BLOCK[0]}x{BLOCK[1]} float32 per epoch, median of {args.rounds} rounds:"
    )
    print_table(rows, ["contender", "median s", "min s", "max s", "vs pool", "failed", "wrong"])

    def show(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    print("\nratio                      of medians  of minima")
    for key, label, target in (
        ("pool_vs_torch_fork_unarmed", "pool / torch fork unarmed", "target <= 1.10"),
        ("spawn_vs_pool", "spawn / pool", "target > 1"),
        ("zarr_python_fork_vs_pool", "zarr-python fork / pool", "target >= 2"),
    ):
        print(f"{label:<26} {show(ratios[key]):<11} {show(ratios_of_min[key]):<10} ({target})")
    print(
        f"\nPer-worker set-up (median of {costs['forks']} forks; {costs['arrays']} arrays opened in the parent); "
        f"parent, once: checks, memfd copy and load of the extension {costs['memfd_copy_ms']:.1f} ms"
    )
    print_table(
        [
            [
                mode,
                f"{c['setup_ms']:.2f}",
                f"{c['first_use_ms_per_pipeline']:.3f}",
                f"{c['heap_scan_ms']:.1f}",
            ]
            for mode, c in costs["modes"].items()
        ],
        ["mode", "hook at worker start ms", "first use ms / inherited pipeline", "(a gc heap scan would cost) ms"],
    )
    payload = {
        "benchmark": "zarrs",
        "command": "python -m benchmarks.bench_zarrs " + " ".join(argv if argv is not None else sys.argv[1:]),
        "workers": args.workers,
        "rounds": args.rounds,
        "blocks_per_epoch": blocks_per_epoch,
        "array": {
            "shape": SHAPE,
            "shards": SHARDS,
            "chunks": CHUNKS,
            "block": BLOCK,
            "codec": "zstd level 3",
            "dtype": "float32",
        },
        "results": results,
        "ratios": ratios,
        "ratios_of_min": ratios_of_min,
        "setup_costs": costs,
        "elapsed_s": time.perf_counter() - began,
    }
    out = write_json("zarrs-diagnose" if args.diagnose else "zarrs", payload)
    print(f"\nwrote {out} in {payload['elapsed_s']:.0f} s")
    return payload


if __name__ == "__main__":
    # Run as the importable module, so that spawned workers unpickle benchmarks.bench_zarrs.Blocks.
    from benchmarks.bench_zarrs import main as _main

    _main()
