"""``python -m safeloader demo``: torch's DataLoader and safeloader's, side by side, on three real formats.

The demo writes a small compressed zarr array, an HDF5 file and an npz
archive, then for each builds the Dataset most people write: the file is
opened in ``__init__`` and the parent reads one item first (a sanity check,
normalisation statistics...). Each Dataset is loaded with 4 forked workers by
``torch.utils.data.DataLoader`` and by ``safeloader.DataLoader``, each run in
its own interpreter with a deadline, so a hang is killed cleanly. Every item
returned is compared with a direct read of the file. Exit status 0 when every
safeloader run returned correct data.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

ITEMS = 32
PLANE = (256, 256)
ZARR_CHUNKS = (1, 64, 64)  # an item spans 16 chunks: zarrs decodes it on its rayon pool
NUM_WORKERS = 4
BATCH_SIZE = 4
TORCH_DEADLINE = 15.0
SAFELOADER_DEADLINE = 90.0
SAFELOADER_STALL_TIMEOUT = 20.0
ERROR_LIMIT = 160  # characters of an error shown in a progress line
CELL_LIMIT = 60  # characters of a table cell

FORMATS = {
    "zarr": "zarr array, zstd, read through zarrs",
    "hdf5": "HDF5 file, gzip chunks (h5py)",
    "npz": "npz archive (np.load)",
}


def expected_item(index: int) -> np.ndarray:
    """The content of item ``index`` in every format: distinct values, so a wrong item is caught."""
    plane = np.arange(PLANE[0] * PLANE[1], dtype=np.float32).reshape(PLANE)
    return plane * 0.25 + index * 1000.0


# -- error text ----------------------------------------------------------------------

# torch re-raises a worker's exception in the parent as
# "Caught X in DataLoader worker process N.\nOriginal Traceback (most recent call last):\n...",
# the worker's traceback as text, its last unindented lines being "module.X: message".
_ORIGINAL_TRACEBACK = "Original Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::[ ]?(?P<message>.*))?$")


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word boundary with "..." if longer."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    space = cut.rfind(" ")
    if space > limit // 2:  # else one long word: cut inside it rather than lose most of the text
        cut = cut[:space]
    return cut.rstrip(" ,;:.") + "..."


def _original_exception(traceback_text: str) -> tuple[str, str] | None:
    """(type name, message) of the last exception of a formatted traceback, or None."""
    lines = traceback_text.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    start = frames[-1] + 1 if frames else 0
    for i in range(start, len(lines)):
        line = lines[i]
        if not line or line.startswith(" "):  # the frame's source line, carets
            continue
        match = _EXCEPTION_LINE.match(line)
        if not match:
            return None
        message = [match.group("message") or "", *lines[i + 1 :]]
        return match.group("type").rsplit(".", 1)[-1], " ".join(part.strip() for part in message if part.strip())
    return None


def describe_error(error: BaseException, limit: int = ERROR_LIMIT) -> str:
    """The error's type and its own message, e.g. "BadZipFile: Bad magic number for file header".

    For an error torch re-raised from a worker, the worker's original exception
    (its type and message, from the traceback torch carries as text), not the
    wrapper's "Caught X in DataLoader worker process N." line. Long messages are
    cut at a word boundary.
    """
    text = str(error).strip()
    if _ORIGINAL_TRACEBACK in text:
        original = _original_exception(text.split(_ORIGINAL_TRACEBACK, 1)[1])
        if original is not None:
            name, message = original
            return shorten(f"{name}: {message}" if message else name, limit)
    name = type(error).__name__
    return shorten(f"{name}: {text}" if text else name, limit)


# -- the data ------------------------------------------------------------------------


def write_data(root: str) -> dict[str, str]:
    """Write the three files under ``root``; returns format -> path."""
    import h5py
    import zarr
    from zarr.codecs import ZstdCodec

    paths = {
        "zarr": os.path.join(root, "volume.zarr"),
        "hdf5": os.path.join(root, "volume.h5"),
        "npz": os.path.join(root, "volume.npz"),
    }
    stack = np.stack([expected_item(i) for i in range(ITEMS)])
    array = zarr.create_array(
        paths["zarr"], shape=stack.shape, chunks=ZARR_CHUNKS, dtype="float32", compressors=ZstdCodec(level=1)
    )
    array[:] = stack
    with h5py.File(paths["hdf5"], "w") as f:
        f.create_dataset("volume", data=stack, chunks=(1, *PLANE), compression="gzip", compression_opts=1)
    np.savez(paths["npz"], **{f"item_{i:03d}": stack[i] for i in range(ITEMS)})
    return paths


class ZarrDataset:
    """Opens the zarr array in ``__init__``; zarr decodes with zarrs' Rust pipeline."""

    def __init__(self, path: str) -> None:
        import zarr
        import zarrs  # noqa: F401  (registers the pipeline)

        zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
        self.array = zarr.open_array(path, mode="r")

    def __len__(self) -> int:
        return self.array.shape[0]

    def __getitem__(self, index: int) -> np.ndarray:
        return np.asarray(self.array[index : index + 1])[0]


class H5Dataset:
    """Opens the HDF5 file in ``__init__``, as in the classic h5py-with-DataLoader snippet."""

    def __init__(self, path: str) -> None:
        import h5py

        self.file = h5py.File(path, "r")
        self.volume = self.file["volume"]

    def __len__(self) -> int:
        return self.volume.shape[0]

    def __getitem__(self, index: int) -> np.ndarray:
        return self.volume[index]


class NpzDataset:
    """Opens the npz archive in ``__init__`` (``np.load`` keeps the zip file open)."""

    def __init__(self, path: str) -> None:
        self.archive = np.load(path)
        self.keys = sorted(self.archive.files)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.archive[self.keys[index]]


DATASETS = {"zarr": ZarrDataset, "hdf5": H5Dataset, "npz": NpzDataset}


# -- one run, in its own interpreter -------------------------------------------------


def run_one(fmt: str, loader_kind: str, path: str) -> dict[str, Any]:
    """Load every item of ``fmt`` with 4 workers; compare with a direct read. Runs in a child process."""
    import torch
    import torch.utils.data

    dataset_type = DATASETS[fmt]
    dataset = type(dataset_type.__name__, (dataset_type, torch.utils.data.Dataset), {})(path)
    dataset[0]  # the parent reads first
    if loader_kind == "torch":
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS)
    else:
        import safeloader

        loader = safeloader.DataLoader(
            dataset, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS, stall_timeout=SAFELOADER_STALL_TIMEOUT
        )
    start = time.perf_counter()
    items: list[np.ndarray] = []
    try:
        for batch in loader:
            items.extend(batch.numpy())
    except Exception as error:  # what torch's loader raises is part of the result
        return {
            "status": "failed",
            "error": describe_error(error),
            "seconds": time.perf_counter() - start,
        }
    seconds = time.perf_counter() - start
    direct: Any = dataset_type(path)  # a fresh open, read in this process: the reference
    wrong = sum(not np.array_equal(item, direct[i]) for i, item in enumerate(items))
    wrong += abs(len(direct) - len(items))
    also_expected = all(np.array_equal(direct[i], expected_item(i)) for i in range(len(direct)))
    status = "correct" if wrong == 0 and also_expected else "wrong"
    return {"status": status, "items": len(items), "wrong": wrong, "seconds": seconds}


# -- the demo ------------------------------------------------------------------------


@dataclass
class Outcome:
    status: str  # correct, wrong, failed, hung, crashed
    seconds: float
    detail: str

    @property
    def cell(self) -> str:
        return {
            "correct": f"correct ({self.detail})",
            "wrong": f"WRONG DATA ({self.detail})",
            "failed": f"FAILED: {self.detail}",
            "hung": f"HUNG, killed after {self.detail}",
            "crashed": f"CRASHED: {self.detail}",
        }[self.status]


def _spawn_run(fmt: str, loader_kind: str, path: str, deadline: float) -> Outcome:
    command = [sys.executable, "-m", "safeloader.demo", "--child", fmt, loader_kind, path]
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)  # the run and its workers: no orphans
        process.communicate()
        return Outcome("hung", time.perf_counter() - start, f"{deadline:g} s")
    elapsed = time.perf_counter() - start
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        return Outcome("crashed", elapsed, f"exit {process.returncode}: {shorten(last, 120)}")
    result = json.loads(lines[-1])
    if result["status"] == "failed":
        return Outcome("failed", result["seconds"], result["error"])
    detail = f"{result['items'] - result['wrong']}/{ITEMS} items match"
    return Outcome(result["status"], result["seconds"], detail)


def _table(rows: list[tuple[str, Outcome, Outcome]]) -> str:
    header = ("data", "torch.utils.data.DataLoader", "load time", "safeloader.DataLoader", "load time")
    body: list[tuple[str, ...]] = [
        tuple(
            shorten(cell, CELL_LIMIT)
            for cell in (FORMATS[f], t.cell, f"{t.seconds:.1f} s", s.cell, f"{s.seconds:.1f} s")
        )
        for f, t, s in rows
    ]  # long cells cut at a word boundary, never mid-word
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip()

    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, body)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="safeloader demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--torch-deadline",
        type=float,
        default=TORCH_DEADLINE,
        help="seconds before torch's run is declared hung and killed (default %(default)s)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated data directory")
    args = parser.parse_args(argv)

    root = tempfile.mkdtemp(prefix="safeloader-demo-")
    try:
        print(
            f"Writing {ITEMS} items of {PLANE[0]}x{PLANE[1]} float32 to a zarr array, an HDF5 file and an npz "
            f"archive in {root} ...",
            flush=True,
        )
        paths = write_data(root)
        print(
            f"Each Dataset opens its file in __init__ and the parent reads item 0 first; then {NUM_WORKERS} "
            f"forked workers load every item (batch size {BATCH_SIZE}).\n",
            flush=True,
        )
        rows = []
        total = len(FORMATS) * 2
        step = 0
        for fmt in FORMATS:
            outcomes = {}
            for loader_kind, deadline in (("torch", args.torch_deadline), ("safeloader", SAFELOADER_DEADLINE)):
                step += 1
                name = "torch.utils.data.DataLoader" if loader_kind == "torch" else "safeloader.DataLoader"
                print(f"[{step}/{total}] {FORMATS[fmt]} with {name} ... ", end="", flush=True)
                outcome = _spawn_run(fmt, loader_kind, paths[fmt], deadline)
                print(f"{outcome.cell} ({outcome.seconds:.1f} s)", flush=True)
                outcomes[loader_kind] = outcome
            rows.append((fmt, outcomes["torch"], outcomes["safeloader"]))
        print("\n" + _table(rows) + "\n")
        ok = all(s.status == "correct" for _, _, s in rows)
        if ok:
            print("safeloader returned correct data for every format (checked item by item against a direct read).")
        else:
            print("safeloader did NOT return correct data for every format: see the table.")
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"Data kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _child(argv: list[str]) -> int:
    fmt, loader_kind, path = argv
    print(json.dumps(run_one(fmt, loader_kind, path)), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
