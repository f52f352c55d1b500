"""``python -m safeloader demo``: torch's DataLoader and safeloader's, side by side, on three real formats.

How it works: docs/internals.md, ``safeloader.demo``."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

# What a run raised, in a line: the worker's own exception, not torch's wrapper.
from ._demo_errors import describe_error, shorten

ITEMS = 32
PLANE = (256, 256)
NUM_WORKERS = 4
BATCH_SIZE = 4
TORCH_DEADLINE = 15.0
SAFELOADER_DEADLINE = 90.0
SAFELOADER_STALL_TIMEOUT = 20.0
MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path, less its final NUL)
EXIT_GRACE = 3.0  # seconds a run that printed its result gets to exit
CELL_LIMIT = 60  # characters of a table cell

FORMATS = {
    "zarr": "zarr array, zstd, read through zarrs",
    "hdf5": "HDF5 file via a file object (h5py)",
    "npz": "npz archive (np.load)",
}
# The modules each format needs, and the extra of torch-safeloader that installs them.
NEEDS = {"zarr": (("zarr", "zarrs"), "zarr"), "hdf5": (("h5py",), "h5py"), "npz": ((), "")}
CHUNK = (1, 64, 64)  # an item spans 16 chunks: zarrs decodes it on its rayon pool, h5py makes 16 reads

DESCRIPTION = (
    "Load three Datasets, each opening its file in __init__ as most people write it (a zarr array read "
    "through zarrs, an HDF5 file read through a Python file object, an npz archive), with torch's "
    "DataLoader and with safeloader's, 4 forked workers each, and check every item against a direct "
    "read. Formats whose libraries are not installed are skipped, naming the extra to install. "
    "About 40 s. Exit status 0 when safeloader returned correct data for every format it ran."
)


def missing_modules(fmt: str) -> list[str]:
    """The modules ``fmt`` needs that do not import here (not installed, or broken)."""
    missing = []
    for module in NEEDS[fmt][0]:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    return missing


def install_hint(formats: list[str]) -> str:
    """The pip command that installs what ``formats`` need, e.g. ``pip install 'torch-safeloader[zarr,h5py]'``."""
    extras = ",".join(NEEDS[fmt][1] for fmt in formats)
    return f"pip install 'torch-safeloader[{extras}]'"


def expected_item(index: int) -> np.ndarray:
    """The content of item ``index`` in every format: distinct values, so a wrong item is caught."""
    plane = np.arange(PLANE[0] * PLANE[1], dtype=np.float32).reshape(PLANE)
    return plane * 0.25 + index * 1000.0


# -- the data ------------------------------------------------------------------------


def write_data(root: str, formats: list[str]) -> dict[str, str]:
    """Write the files of ``formats`` under ``root``; returns format -> path."""
    paths = {"zarr": os.path.join(root, "volume.zarr"), "hdf5": os.path.join(root, "volume.h5")}
    paths["npz"] = os.path.join(root, "volume.npz")
    stack = np.stack([expected_item(i) for i in range(ITEMS)])
    if "zarr" in formats:
        import zarr
        from zarr.codecs import ZstdCodec

        array = zarr.create_array(
            paths["zarr"], shape=stack.shape, chunks=CHUNK, dtype="float32", compressors=ZstdCodec(level=1)
        )
        array[:] = stack
    if "hdf5" in formats:
        import h5py

        with h5py.File(paths["hdf5"], "w") as f:
            f.create_dataset("volume", data=stack, chunks=CHUNK, compression="gzip", compression_opts=1)
    if "npz" in formats:
        np.savez(paths["npz"], **{f"item_{i:03d}": stack[i] for i in range(ITEMS)})
    return {fmt: paths[fmt] for fmt in formats}


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
    """Opens the HDF5 file in ``__init__`` through a Python file object, as remote or archived HDF5 is
    read (why: docs/internals.md, ``safeloader.demo``)."""

    def __init__(self, path: str) -> None:
        import h5py

        self.file = h5py.File(open(path, "rb"), "r")  # h5py reads through it, as long as the Dataset lives
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


def _result_line(process: subprocess.Popen[bytes], until: float) -> str | None:
    """The run's result, its JSON line, as soon as it is printed; None at EOF or at ``until`` (monotonic)."""
    assert process.stdout is not None
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while (left := until - time.monotonic()) > 0 and selector.select(left):
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                return None
            buffer += chunk
            for line in buffer.decode(errors="replace").split("\n")[:-1]:  # whole lines only
                if line.startswith("{"):
                    return line
    return None


def _spawn_run(fmt: str, loader_kind: str, path: str, deadline: float, tmpdir: str) -> Outcome:
    """One run in its own interpreter, its temporary files in ``tmpdir`` (killed ``EXIT_GRACE`` s after its result)."""
    command = [sys.executable, "-m", "safeloader.demo", "--child", fmt, loader_kind, path]
    start = time.perf_counter()
    with tempfile.TemporaryFile(dir=tmpdir) as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True, env={**os.environ, "TMPDIR": tmpdir}
        )
        line = _result_line(process, time.monotonic() + deadline)
        try:
            process.wait(timeout=EXIT_GRACE if line is not None or process.poll() is not None else 0)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the run and its workers: no orphans
            process.wait()
        finally:
            assert process.stdout is not None
            process.stdout.close()
        elapsed = time.perf_counter() - start
        if line is None and process.returncode == -signal.SIGKILL:
            return Outcome("hung", elapsed, f"{deadline:g} s")
        if line is None:
            stderr.seek(0)
            last = (stderr.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            return Outcome("crashed", elapsed, f"exit {process.returncode}: {shorten(last, 120)}")
    result = json.loads(line)
    if result["status"] == "failed":
        return Outcome("failed", result["seconds"], result["error"])
    detail = f"{result['items'] - result['wrong']}/{ITEMS} items match"
    return Outcome(result["status"], result["seconds"], detail)


def _table(rows: list[tuple[str, Outcome, Outcome]], skipped: list[str]) -> str:
    header = ("data", "torch.utils.data.DataLoader", "load time", "safeloader.DataLoader", "load time")
    body: list[tuple[str, ...]] = [
        tuple(
            shorten(cell, CELL_LIMIT)
            for cell in (FORMATS[f], t.cell, f"{t.seconds:.1f} s", s.cell, f"{s.seconds:.1f} s")
        )
        for f, t, s in rows
    ]  # long cells cut at a word boundary, never mid-word
    body += [(FORMATS[f], f"not run: {install_hint([f])}", "", "", "") for f in skipped]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip()

    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, body)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, on its own parser and on ``safeloader demo``'s."""
    parser.add_argument(
        "--torch-deadline",
        type=float,
        default=TORCH_DEADLINE,
        metavar="SECONDS",
        help="seconds before a run of torch's loader counts as hung and is killed (default: %(default)g)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated data folder, and say where it is")


def main(argv: list[str] | None = None) -> int:
    """``python -m safeloader.demo [options]``."""
    parser = argparse.ArgumentParser(prog="safeloader demo", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the demo with parsed options (``torch_deadline``, ``keep``); returns the exit status."""
    formats = [fmt for fmt in FORMATS if not missing_modules(fmt)]
    skipped = [fmt for fmt in FORMATS if fmt not in formats]
    for fmt in skipped:
        print(
            f"Skipping the {FORMATS[fmt]} row: {', '.join(missing_modules(fmt))} not installed "
            f"({install_hint([fmt])} installs it).",
            flush=True,
        )
    root = tempfile.mkdtemp(prefix="sl-demo-")
    # The runs' TMPDIR, so that what a killed run leaves goes with root; not where the Unix socket
    # a worker sends a batch through (pymp-XXXXXXXX/listener-XXXXXXXX) would pass the kernel's 107 bytes.
    runs_tmp = root if len(root) + 32 <= MAX_SOCKET_PATH else tempfile.gettempdir()
    try:
        print(
            f"Writing {ITEMS} items of {PLANE[0]}x{PLANE[1]} float32 in each format ({', '.join(formats)}) "
            f"to {root} ...",
            flush=True,
        )
        paths = write_data(root, formats)
        print(
            f"Each Dataset opens its file in __init__ and the parent reads item 0 first; then {NUM_WORKERS} "
            f"forked workers load every item (batch size {BATCH_SIZE}).\n",
            flush=True,
        )
        rows = []
        total = len(formats) * 2
        step = 0
        for fmt in formats:
            outcomes = {}
            for loader_kind, deadline in (("torch", args.torch_deadline), ("safeloader", SAFELOADER_DEADLINE)):
                step += 1
                name = "torch.utils.data.DataLoader" if loader_kind == "torch" else "safeloader.DataLoader"
                print(f"[{step}/{total}] {FORMATS[fmt]} with {name} ... ", end="", flush=True)
                outcome = _spawn_run(fmt, loader_kind, paths[fmt], deadline, runs_tmp)
                print(f"{outcome.cell} ({outcome.seconds:.1f} s)", flush=True)
                outcomes[loader_kind] = outcome
            rows.append((fmt, outcomes["torch"], outcomes["safeloader"]))
        print("\n" + _table(rows, skipped) + "\n")
        ok = all(s.status == "correct" for _, _, s in rows)
        if ok:
            every = "every format" if not skipped else "every format it ran"
            print(f"safeloader returned correct data for {every} (checked item by item against a direct read).")
        else:
            print("safeloader did NOT return correct data for every format: see the table.")
        if skipped:
            print(f"To run the other rows too: {install_hint(skipped)}")
        if "hdf5" in formats:
            print(
                "HDF5: an h5py file opened by its path (the default driver) reads correctly under plain fork too; "
                "a file object, as here, or driver='stdio' does not."
            )
        return 0 if ok else 1
    finally:
        if args.keep:
            for name in os.listdir(root):
                if name.startswith("pymp-"):  # a killed run's, not data
                    shutil.rmtree(os.path.join(root, name), ignore_errors=True)
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
