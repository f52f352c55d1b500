"""zarrs backend: forked DataLoader workers decode zarrs arrays correctly, never hang, keep Rust decoding.

The scenario (shared/seeds/zarrs-dataloader-deadlock.txt): the parent decodes a
zarr array through zarrs' Rust pipeline, then a DataLoader forks workers; the
first multi-chunk decode in a worker waits forever on the parent's rayon pool.
Every loader here passes torch's ``timeout=`` so that a regression fails the
test instead of hanging it; torch's own hang is shown in a child process.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
import zarrs
from torch.utils.data import Dataset

import safeloader
from safeloader import DataLoader, HookError
from safeloader._options import ZARRS_MODES, Options, default_thread_budget
from safeloader.backends import _zarrs_layout, _zarrs_native
from safeloader.backends import zarrs as backend
from safeloader.native import thread_census

from .subproc import check_script, run_script
from .zarrs_data import expected, write_arrays, zarrs_pipeline

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parent.parent
LOADER_TIMEOUT = 30  # seconds torch waits for a batch before raising: a hang fails, never blocks

# (row slice, column slice) windows of the 256x256 arrays; chunks are 64x64,
# shards 128x128 of 32x32 inner chunks.
READS = {
    "full": (slice(None), slice(None)),
    "inside one chunk": (slice(3, 20), slice(5, 30)),
    "cross-chunk": (slice(50, 140), slice(30, 200)),
    "cross-shard": (slice(100, 250), slice(60, 250)),
    "one row": (7, slice(None)),
}
# Writes in workers: each touches several chunks / inner chunks, never a chunk
# or shard of another item (workers write concurrently).
WRITES = [
    (slice(128 * (i // 2) + 20, 128 * (i // 2) + 80), slice(128 * (i % 2) + 10, 128 * (i % 2) + 100)) for i in range(4)
]


@pytest.fixture(scope="module")
def arrays(tmp_path_factory) -> dict[str, str]:
    return write_arrays(tmp_path_factory.mktemp("zarrs"))


@pytest.fixture(autouse=True)
def zarrs_config():
    """zarr decodes with zarrs in the test and in its workers; mode checks start afresh."""
    backend.BACKEND.forget_mode_checks()
    with zarrs_pipeline():
        yield
    backend.BACKEND.forget_mode_checks()


def open_array(path: str, mode: str = "r") -> zarr.Array:
    """Open with the configured pipeline: zarrs', except in a worker in "python" mode."""
    array = zarr.open_array(path, mode=mode)
    pipeline = "BatchedCodecPipeline" if backend.worker_mode() == "python" else "ZarrsCodecPipeline"
    assert type(array._async_array.codec_pipeline).__name__ == pipeline
    return array


class Reads(Dataset):
    """Item i: (name of read i, what the worker read, the zarrs mode in force there).

    The array is opened in the parent (held by the Dataset, as users do) or,
    with ``path_only``, inside each worker on first use.
    """

    def __init__(self, path: str, *, path_only: bool = False, repeat: int = 1) -> None:
        self.path = path
        self.array = None if path_only else open_array(path)
        self.names = list(READS) * repeat

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int):
        if self.array is None:
            self.array = open_array(self.path)
        name = self.names[index]
        return name, torch.from_numpy(np.ascontiguousarray(self.array[READS[name]])), backend.worker_mode()


def parent_decodes(path: str) -> np.ndarray:
    """The parent's own multi-chunk read: arms the deadlock, and is the reference."""
    data = open_array(path)[:]
    np.testing.assert_array_equal(data, expected())
    return data


def check_reads(items, reference: np.ndarray, mode: str | None = "pool") -> None:
    assert len(items) > 0
    for name, data, worker_mode in items:
        np.testing.assert_array_equal(data.numpy(), reference[READS[name]], err_msg=name)
        assert worker_mode == mode, f"{name} read in zarrs mode {worker_mode!r}, want {mode!r}"


# -- the seed scenario: torch hangs, safeloader does not -------------------------------

# The user's program is tests/children/zarrs_seed.py.


@pytest.mark.torch_baseline
def test_torch_dataloader_hangs_after_the_parent_decoded_zarrs(arrays):
    result = run_script("zarrs_seed.py", arrays["plain"], timeout=20, expect_hang=True)
    assert result.timed_out, f"torch's own DataLoader was expected to hang:\n{result}"
    assert "iterating" in result.stdout  # the hang is in the loader, not before it


def test_same_program_completes_after_safeloader_install_even_imported_after_zarrs(arrays):
    # safeloader is imported after the parent opened and decoded the array:
    # pipelines created before safeloader existed must be handled too.
    result = check_script("zarrs_seed.py", arrays["plain"], "install", timeout=60)
    assert "all batches equal the direct read" in result.stdout


def test_costs_nothing_when_zarrs_is_not_imported():
    result = check_script("zarrs_not_imported.py", timeout=60)
    assert result.stdout.strip() == "[] None {}"


# -- safeloader: exact data, every worker count, persistent or not ---------------------


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh-workers", "persistent"])
@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_default_mode_returns_exactly_the_direct_read(arrays, num_workers, persistent):
    reference = parent_decodes(arrays["plain"])
    dataset = Reads(arrays["plain"], repeat=2)
    loader = DataLoader(
        dataset, batch_size=None, num_workers=num_workers, persistent_workers=persistent, timeout=LOADER_TIMEOUT
    )
    for _epoch in range(2):
        check_reads(list(loader), reference, mode="pool")
    if persistent:  # shut the workers down now rather than whenever the loader is collected
        loader._iterator._shutdown_workers()


def test_install_arms_torch_dataloader(arrays, clean_registry):
    reference = parent_decodes(arrays["sharded"])
    safeloader.install()
    loader = torch.utils.data.DataLoader(
        Reads(arrays["sharded"]), batch_size=None, num_workers=2, timeout=LOADER_TIMEOUT
    )
    check_reads(list(loader), reference, mode="pool")


# -- each mode: plain and sharded, opened in the parent or in the worker ---------------


@pytest.mark.parametrize("opened_in", ["parent", "worker"])
@pytest.mark.parametrize("kind", ["plain", "sharded"])
@pytest.mark.parametrize("mode", ZARRS_MODES)
def test_each_mode_reads_exactly(arrays, mode, kind, opened_in):
    reference = parent_decodes(arrays[kind])
    dataset = Reads(arrays[kind], path_only=opened_in == "worker")
    loader = DataLoader(dataset, batch_size=None, num_workers=2, zarrs_mode=mode, timeout=LOADER_TIMEOUT)
    check_reads(list(loader), reference, mode=mode)


def test_mode_set_process_wide_with_configure(arrays, clean_registry):
    reference = parent_decodes(arrays["plain"])
    safeloader.configure(zarrs_mode="serial")
    loader = DataLoader(Reads(arrays["plain"]), batch_size=None, num_workers=2, timeout=LOADER_TIMEOUT)
    check_reads(list(loader), reference, mode="serial")


class Writes(Dataset):
    """Item i writes block i (several chunks) with values 1000 + i, reads it back."""

    def __init__(self, path: str, *, path_only: bool) -> None:
        self.path = path
        self.array = None if path_only else open_array(path, mode="r+")

    def __len__(self) -> int:
        return len(WRITES)

    def __getitem__(self, index: int):
        if self.array is None:
            self.array = open_array(self.path, mode="r+")
        block = WRITES[index]
        shape = self.array[block].shape
        self.array[block] = np.full(shape, 1000.0 + index, dtype=np.float32)
        return torch.from_numpy(self.array[block])


@pytest.mark.parametrize("opened_in", ["parent", "worker"])
@pytest.mark.parametrize("kind", ["plain", "sharded"])
@pytest.mark.parametrize("mode", ZARRS_MODES)
def test_each_mode_writes_in_workers(tmp_path, mode, kind, opened_in):
    path = write_arrays(tmp_path)[kind]
    parent_decodes(path)
    want = expected().copy()
    for index, block in enumerate(WRITES):
        want[block] = 1000.0 + index
    dataset = Writes(path, path_only=opened_in == "worker")
    loader = DataLoader(dataset, batch_size=None, num_workers=2, zarrs_mode=mode, timeout=LOADER_TIMEOUT)
    for index, block in enumerate(loader):
        assert (block.numpy() == 1000.0 + index).all()
    np.testing.assert_array_equal(open_array(path)[:], want)


# -- what each mode does in the worker ---------------------------------------------------


_PARENT_INTERNAL = sys.modules["zarrs._internal"]


class ThreadsOfARead(Dataset):
    """Item: (RAYON_NUM_THREADS, native threads a multi-chunk read started) in the worker."""

    def __init__(self, path: str) -> None:
        self.array = open_array(path)

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        before = {tid for tid, _ in thread_census().foreign}
        self.array[:]
        started = [tid for tid, _ in thread_census().foreign if tid not in before]
        fresh = sys.modules["zarrs._internal"] is not _PARENT_INTERNAL
        return os.environ.get("RAYON_NUM_THREADS"), len(started), fresh


@pytest.mark.parametrize("mode", ZARRS_MODES)
def test_pool_mode_runs_its_own_budgeted_rust_pool_others_start_no_native_thread(arrays, mode):
    parent_decodes(arrays["plain"])
    loader = DataLoader(
        ThreadsOfARead(arrays["plain"]),
        batch_size=None,
        num_workers=2,
        zarrs_mode=mode,
        thread_budget=3,
        timeout=LOADER_TIMEOUT,
    )
    results = [tuple(item) for item in loader]
    if mode == "pool":  # the worker's own zarrs module, with a pool of exactly the budget
        assert results == [("3", 3, True)] * 2
    else:  # decoding on the calling thread (serial) or in zarr-python: no rayon thread
        assert [(started, fresh) for _, started, fresh in results] == [(0, False)] * 2


def test_default_thread_budget_shares_the_cores_among_workers():
    cores = len(os.sched_getaffinity(0))
    assert Options().threads_per_worker(2) == default_thread_budget(2) == max(1, cores // 2)
    assert Options().threads_per_worker(4 * cores) == 1
    assert Options(thread_budget=5).threads_per_worker(2) == 5


# -- versions and fallbacks ----------------------------------------------------------------


def test_supported_versions_are_declared_checked_and_match_the_package_extra():
    extra_line = re.search(r"^zarr = (\[.*\])$", (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    extra = ast.literal_eval(extra_line.group(1))
    declared = {
        name: f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"
        for name, (low, high) in backend.SUPPORTED_VERSIONS.items()
    }
    assert sorted(f"{name}{spec}" for name, spec in declared.items()) == sorted(extra)
    assert _zarrs_layout.version_problem("zarr") is None, zarr.__version__
    assert _zarrs_layout.version_problem("zarrs") is None, zarrs.__version__
    for mode in ZARRS_MODES:  # the installed versions support every mode
        assert _zarrs_layout.MODE_PROBLEMS[mode]() is None, mode


def test_the_parent_finds_every_binding_a_worker_must_move_to_its_copy():
    internal = sys.modules["zarrs._internal"]
    bindings = _zarrs_native.find_bindings(internal)
    assert {(module, attribute) for module, attribute, _ in bindings} == set(_zarrs_layout.INTERNAL_BINDINGS)
    assert all(
        getattr(sys.modules[module], attribute) is getattr(internal, name) for module, attribute, name in bindings
    )


# -- zarrs modules imported late, loaders started from several threads ---------------------

def test_zarrs_submodule_imported_after_the_first_loader_start_moves_to_the_worker_copy(arrays):
    # Found only once, its ChunkItem stayed the parent module's in the workers:
    # "TypeError: argument 'chunk_descriptions': 'ChunkItem' object cannot be cast as 'ChunkItem'".
    result = check_script("zarrs_late_submodule.py", arrays["plain"], timeout=90)
    assert "both loaders read exactly" in result.stdout


def test_bindings_are_found_again_only_when_zarrs_modules_change(monkeypatch):
    internal = sys.modules["zarrs._internal"]
    searches = []
    find = _zarrs_native.find_bindings
    monkeypatch.setattr(_zarrs_native, "find_bindings", lambda module: searches.append(module) or find(module))
    first = backend.BACKEND.current_bindings()
    assert [backend.BACKEND.current_bindings() for _ in range(3)] == [first] * 3
    import json.tool  # noqa: F401  (an import of a module that is not zarrs': checked, not searched again)

    assert backend.BACKEND.current_bindings() == first
    assert len(searches) <= 1  # the first call searches if the test process imported since the last one

    late = types.ModuleType("zarrs._safeloader_probe")
    late.ChunkItem = internal.ChunkItem
    monkeypatch.setitem(sys.modules, late.__name__, late)
    searched = len(searches)
    assert set(backend.BACKEND.current_bindings()) == {*first, (late.__name__, "ChunkItem", "ChunkItem")}
    assert len(searches) == searched + 1
    monkeypatch.delitem(sys.modules, late.__name__)
    assert backend.BACKEND.current_bindings() == first


def test_loaders_starting_workers_in_two_threads_at_once_keep_their_own_modes(arrays):
    # In a fresh interpreter: a library that holds its own lock across fork
    # (h5py registers one at import) serialises two threads' forks, so the
    # barrier that forces them to interleave could never be passed there.
    result = check_script("zarrs_two_threads.py", arrays["plain"], timeout=90)
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen == {"python": ["python", "python"], "serial": ["serial", "serial"]}


def run_collecting_warnings(loader) -> tuple[list, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        items = [item for _epoch in range(2) for item in loader]
    return items, [w for w in caught if issubclass(w.category, backend.ZarrsFallbackWarning)]


def test_unsupported_zarrs_version_falls_back_to_python_with_one_warning(arrays, monkeypatch):
    reference = parent_decodes(arrays["plain"])
    monkeypatch.setattr(zarrs, "__version__", "0.4.0")
    loader = DataLoader(Reads(arrays["plain"]), batch_size=None, num_workers=2, timeout=LOADER_TIMEOUT)
    items, fallbacks = run_collecting_warnings(loader)
    check_reads(items, reference, mode="python")
    assert len(fallbacks) == 1, [str(w.message) for w in fallbacks]
    message = str(fallbacks[0].message)
    assert "zarrs_mode='python' instead of 'pool'" in message
    assert "zarrs must be >=0.2.2,<0.3, got '0.4.0'" in message


def test_zarr_release_not_yet_verified_falls_back_to_python_with_one_warning(arrays, monkeypatch):
    # The releases verified are admitted (3.1 up to the first unverified minor); the next is not assumed.
    low, high = backend.SUPPORTED_VERSIONS["zarr"]
    assert low == (3, 1) and high >= (3, 5), high
    unverified = _zarrs_layout.dotted(high) + ".0"
    reference = parent_decodes(arrays["plain"])
    monkeypatch.setattr(zarr, "__version__", unverified)
    loader = DataLoader(Reads(arrays["plain"]), batch_size=None, num_workers=2, timeout=LOADER_TIMEOUT)
    items, fallbacks = run_collecting_warnings(loader)
    check_reads(items, reference, mode="python")
    assert len(fallbacks) == 1, [str(w.message) for w in fallbacks]
    assert f"zarr must be >=3.1,<{_zarrs_layout.dotted(high)}, got '{unverified}'" in str(fallbacks[0].message)


def test_unexpected_extension_layout_falls_back_to_serial_with_one_warning(arrays, monkeypatch):
    reference = parent_decodes(arrays["sharded"])
    monkeypatch.setattr(sys.modules["zarrs._internal"], "__file__", "/nonexistent/_internal.abi3.so")
    loader = DataLoader(Reads(arrays["sharded"]), batch_size=None, num_workers=2, timeout=LOADER_TIMEOUT)
    items, fallbacks = run_collecting_warnings(loader)
    check_reads(items, reference, mode="serial")
    assert len(fallbacks) == 1
    assert "zarrs._internal must be loaded from a file" in str(fallbacks[0].message)


def test_worker_that_cannot_install_its_copy_decodes_serially(arrays, monkeypatch):
    reference = parent_decodes(arrays["plain"])

    def broken(*args):
        raise ImportError("simulated")

    monkeypatch.setattr(_zarrs_native, "install_copy", broken)  # inherited by the forked workers
    loader = DataLoader(Reads(arrays["plain"]), batch_size=None, num_workers=2, timeout=LOADER_TIMEOUT)
    check_reads(list(loader), reference, mode="serial")


def test_parent_that_cannot_load_the_copy_falls_back_to_serial_with_one_warning(arrays, monkeypatch):
    reference = parent_decodes(arrays["plain"])

    def broken(fd: int):
        raise ImportError("simulated")

    monkeypatch.setattr(_zarrs_native, "load_copy", broken)
    backend.BACKEND.forget_mode_checks(spare=True)  # as in a process that has not loaded it yet
    loader = DataLoader(Reads(arrays["plain"]), batch_size=None, num_workers=2, timeout=LOADER_TIMEOUT)
    items, fallbacks = run_collecting_warnings(loader)
    check_reads(items, reference, mode="serial")
    assert len(fallbacks) == 1
    assert "a loadable copy of" in str(fallbacks[0].message) and "simulated" in str(fallbacks[0].message)


def test_every_worker_installs_the_one_spare_copy_the_parent_loaded(arrays):
    reference = parent_decodes(arrays["plain"])
    for _ in range(2):  # a second loader reuses the spare: the parent never used it
        check_reads(list(DataLoader(Reads(arrays["plain"]), batch_size=None, num_workers=2)), reference, mode="pool")
    spare = backend.BACKEND.spare_copy()
    assert spare is not None and spare is not sys.modules["zarrs._internal"]
    assert spare.__file__ == sys.modules["zarrs._internal"].__file__


def test_before_the_parent_started_zarrs_pool_workers_build_their_own_and_no_copy_is_loaded(tmp_path):
    # The spare copy (10 ms at the first start) is only for a parent whose zarrs runtime has
    # threads. Opened lazily in the workers, the array decodes on each worker's own pool.
    result = check_script("zarrs_pool_not_started.py", str(tmp_path), timeout=60)
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["spare loaded"] is False
    assert [item[:3] for item in report["items"]] == [[True, "pool", "2"]] * 4
    assert sorted(item[3] for item in report["items"]) == [0, 0, 2, 2]  # each worker's first read starts 2


def test_no_mode_possible_raises_in_the_parent_instead_of_hanging(arrays, monkeypatch):
    parent_decodes(arrays["plain"])
    dataset = Reads(arrays["plain"])
    from zarr.core.codec_pipeline import BatchedCodecPipeline

    monkeypatch.setattr(zarrs, "__version__", "0.4.0")  # no pool, no serial
    monkeypatch.setattr(BatchedCodecPipeline, "from_codecs", None)  # no python
    loader = DataLoader(dataset, batch_size=None, num_workers=2, timeout=LOADER_TIMEOUT)
    with pytest.raises(HookError, match="cannot make zarrs safe in forked DataLoader workers") as raised:
        list(loader)
    assert raised.value.hook == "zarrs" and raised.value.phase == "before"


# -- stores that are not local files -------------------------------------------------------

def test_http_store_pool_mode_keeps_zarrs_serial_mode_says_it_is_unsupported(arrays):
    root = str(Path(arrays["plain"]).parent)
    result = check_script("zarrs_http_store.py", root, timeout=60)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["pool"] == [[True, "pool"]] * 4  # the worker's own copy has its own async runtime
    assert report["python"] == [[True, "python"]] * 4  # opened in the worker, read by zarr-python
    assert report["serial"].startswith("ZarrsStoreError: "), report["serial"]
    assert "zarrs cannot read" in report["serial"]
    assert "with zarrs_mode='serial'" in report["serial"] and "Use zarrs_mode='pool'" in report["serial"]
