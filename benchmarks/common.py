"""Shared benchmark plumbing: alternate contenders, summarise, write JSON with the machine's facts."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def alternate(contenders: dict[str, Callable[[], float | None]], repeats: int, progress: str = "") -> dict:
    """Run each contender ``repeats`` times, interleaved (A B C, B C A, ...), so that
    machine noise hits all of them alike. A contender returns seconds, or None for
    a hang/failure (recorded, never waited out)."""
    names = list(contenders)
    samples: dict[str, list[float | None]] = {name: [] for name in names}
    for round_ in range(repeats):
        order = names[round_ % len(names):] + names[: round_ % len(names)]
        for name in order:
            if progress:
                print(f"\r{progress}: round {round_ + 1}/{repeats} {name:<40}", end="", file=sys.stderr, flush=True)
            samples[name].append(contenders[name]())
    if progress:
        print(file=sys.stderr)
    return samples


def summarize(values: list[float | None]) -> dict:
    ok = [v for v in values if v is not None]
    if not ok:
        return {"median": None, "min": None, "max": None, "n": 0, "failures": len(values)}
    return {
        "median": statistics.median(ok),
        "min": min(ok),
        "max": max(ok),
        "n": len(ok),
        "failures": len(values) - len(ok),
    }


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def machine() -> dict:
    import numpy
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}
    for name in ("zarr", "zarrs", "h5py", "threadpoolctl", "polars", "spdl", "blosc2", "av"):
        try:
            versions[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "versions": versions,
    }


def write_json(name: str | Path, payload: dict) -> Path:
    """Write a benchmark's result, with the machine's facts, to ``benchmarks/results/<name>.json``
    (or to ``name`` itself when it is a Path): every benchmark's one writer."""
    path = name if isinstance(name, Path) else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if "machine" not in payload:
        payload = {"machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)))
