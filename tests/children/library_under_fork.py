"""A library whose pool the parent used, used again by each forked worker: does it cope with fork?

argv: the case (``CASES``), the loaders to run in turn, comma-separated (``torch``: torch's own
DataLoader, its fork and a 10 s ``timeout``; ``safeloader``: safeloader's DataLoader with default
arguments), and a scratch directory. The
parent runs the case's work with the library's pool on more than one thread, then 2 workers run
it for 4 items. Prints one JSON object per loader: ``parent_threads`` (the library's threads that
took CPU in the parent's work), ``expected`` (the parent's own values), ``items`` (each item: its
value and whether a forked child of this process made it), ``worker_threads`` (for each item, the
library's threads that took CPU in that worker by then), ``warnings`` (UnsafeForkWarnings) and
``error`` (the loader's error, "" if none: torch's "DataLoader timed out" is a hang).
"""

import json
import os
import sys
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

import safeloader
from safeloader import native
from safeloader.diagnostics import thread_owners

CASE, LOADER = sys.argv[1], sys.argv[2]
PARENT = os.getpid()


def busy_threads(marker: str, since: set[int] | None = None) -> int:
    """This process's threads owned by a shared object whose path holds ``marker`` that took CPU;
    with ``since`` (the threads alive before the case began), also those started since then that
    cannot be attributed (a thread is attributed only while it waits: DuckDB's sometimes never is)."""
    found = 0
    for tid, library in thread_owners.owners(native.thread_census().foreign).items():
        if (library is not None and marker in library) or (library is None and since is not None and tid not in since):
            found += _took_cpu(tid)
    return found


def _took_cpu(tid: int) -> bool:
    # The thread's time on a CPU in nanoseconds (schedstat's first field): a worker's pool thread
    # may run less than one clock tick, which utime + stime (in ticks) round to 0.
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as schedstat:
            return int(schedstat.read().split()[0]) > 0
    except (OSError, ValueError, IndexError):  # a kernel without schedstat: clock ticks
        with open(f"/proc/self/task/{tid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return int(fields[11]) + int(fields[12]) > 0  # utime + stime


def tokenizers_case() -> tuple[str, Callable[[int], object]]:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    texts = [" ".join("ab"[(i * j) % 3 % 2] for j in range(100)) for i in range(4_000)]

    def work(index: int) -> object:
        return sum(len(e.ids) + sum(e.ids) for e in tokenizer.encode_batch(texts[index::2]))

    return "tokenizers", work


def torch_case() -> tuple[str, Callable[[int], object]]:
    # torch's inter-op pool (c10's), on which TorchScript's fork runs tasks. Its intra-op pool is GNU
    # OpenMP's (the threadpools backend's): tensors under torch's grain size (32768) keep out of it.
    matrix = torch.linspace(-1, 1, 100 * 100, dtype=torch.float64).reshape(100, 100)
    forks = torch.jit.script(_forks)

    def work(index: int) -> object:
        return [float(value) for value in forks(matrix + index, matrix)]

    return "libc10", work


def torch_intra_op_case() -> tuple[str, Callable[[int], object]]:
    # torch's intra-op work on 2 threads (GNU OpenMP's, counted) leaves a thread of libtorch_cpu's
    # own live in the parent; a worker does the same work on torch's 1 thread.
    torch.set_num_threads(2)
    values = torch.arange(4_000_000, dtype=torch.int64)

    def work(index: int) -> object:
        return [int((values * (index + 1)).sum()), int(values.cumsum(0)[index * 1000])]

    return "libgomp", work


def _product(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    for _ in range(300):
        x = torch.sin(x * matrix) + x / 2
    return x.sum()


def _forks(x: torch.Tensor, matrix: torch.Tensor) -> list[torch.Tensor]:
    futures = [torch.jit.fork(_product, x + k, matrix) for k in range(4)]
    return [torch.jit.wait(future) for future in futures]


def pyarrow_case() -> tuple[str, Callable[[int], object]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pa.table({"k": np.arange(4_000_000) % 1000, "v": np.arange(4_000_000, dtype="f8")})
    chunks = pa.concat_tables([table.slice(i, 250_000) for i in range(0, len(table), 250_000)])

    def work(index: int) -> object:
        grouped = chunks.group_by("k").aggregate([("v", "sum")]).sort_by("k")
        return [float(pc.sum(grouped["v_sum"]).as_py()), float(grouped["v_sum"][index].as_py())]

    return "arrow", work


def numcodecs_case() -> tuple[str, Callable[[int], object]]:
    import numcodecs
    import numcodecs.blosc

    numcodecs.blosc.use_threads = True  # zarr 3 turns it off at import; a program using numcodecs alone has it
    numcodecs.blosc.set_nthreads(2)
    blosc = numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE, blocksize=1 << 16)
    chunk = blosc.encode(np.arange(1 << 22, dtype="i8"))  # 32 MB: 512 blocks, the pool's threads run

    def work(index: int) -> object:
        decoded = np.frombuffer(blosc.decode(chunk), dtype="i8")
        return [int(decoded[index * 1000]), int(decoded.sum())]

    return "blosc", work


def opencv_case() -> tuple[str, Callable[[int], object]]:
    import cv2

    cv2.setNumThreads(2)  # its own pthreads pool (the default backend of the wheels)
    image = np.linspace(0, 1, 2000 * 2000, dtype=np.float32).reshape(2000, 2000)

    def work(index: int) -> object:
        return float(cv2.GaussianBlur(image + index, (31, 31), 0).sum(dtype=np.float64))

    return "cv2", work


def scipy_fft_case() -> tuple[str, Callable[[int], object]]:
    import scipy.fft  # its FFTs run on pocketfft's (scipy 1.17) or ducc0's (1.18) own thread pool

    signal = np.linspace(0, 1, 256 * 16384).reshape(256, 16384)

    def work(index: int) -> object:
        return float(np.abs(scipy.fft.rfft(signal + index, workers=2)).sum())

    return "scipy/fft", work


def numexpr_case() -> tuple[str, Callable[[int], object]]:
    import numexpr

    numexpr.set_num_threads(2)
    a = np.linspace(0, 1, 4_000_000)

    def work(index: int) -> object:
        return float(numexpr.evaluate("sin(a) * a + index", local_dict={"a": a, "index": index}).sum())

    return "numexpr", work


def numba_workqueue_case() -> tuple[str, Callable[[int], object]]:
    os.environ["NUMBA_THREADING_LAYER"] = "workqueue"
    import numba

    numba.set_num_threads(2)

    @numba.njit(parallel=True, cache=False)
    def total(n: int, shift: int) -> float:
        acc = 0.0
        for i in numba.prange(n):
            acc += np.sin(i * 1e-3 + shift)
        return acc

    def work(index: int) -> object:
        return float(total(4_000_000, index))

    return "workqueue", work


def duckdb_case(remedy: bool = False) -> tuple[str, Callable[[int], object]]:
    # The workload, scaled down: a group-by in the parent, a group-by and a parquet scan per
    # item. The scan is what waits (for DuckDB's async I/O threads), at any size; 1M rows keep its threads busy.
    import duckdb

    connection = duckdb.connect()
    if remedy:  # the remedy the refusal names: no async I/O threads, in the parent (SET in a worker crashes it)
        connection.execute("SET async_threads=0")
    connection.execute("create table t as select i % 1000 as k, i as v from range(1_000_000) r(i)")
    parquet = os.path.join(sys.argv[3], "t.parquet")
    connection.execute(f"copy t to '{parquet}' (format parquet)")
    connection.execute("select k, sum(v) from t group by k").fetchall()

    def work(index: int) -> object:
        grouped = connection.execute("select k, sum(v) from t group by k order by k").fetchall()
        scanned = connection.execute(f"select count(*), sum(v) from '{parquet}' where k = ?", [index]).fetchone()
        return [grouped[index][1], *scanned]

    return "duckdb", work


def onnxruntime_case(mode: str = "ORT_SEQUENTIAL") -> tuple[str, Callable[[int], object]]:
    # An InferenceSession held by the Dataset (a 512x512 MatMul and a Relu), 2 intra-op threads.
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    weights = np.linspace(-1, 1, 512 * 512, dtype=np.float32).reshape(512, 512)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 512])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 512])], [numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    options.execution_mode = getattr(onnxruntime.ExecutionMode, mode)
    options.inter_op_num_threads = 2
    for pool in ("intra", "inter"):  # idle threads that block, not spin: their library is then read from their stacks
        options.add_session_config_entry(f"session.{pool}_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def work(index: int) -> object:
        x = np.linspace(-1, 1, 4096 * 512, dtype=np.float32).reshape(4096, 512) + index  # ~0.1 s of CPU
        return float(session.run(None, {"x": x})[0].sum(dtype=np.float64))

    return "onnxruntime", work


CASES = {
    "tokenizers": tokenizers_case, "torch": torch_case, "pyarrow": pyarrow_case, "numcodecs": numcodecs_case,
    "numexpr": numexpr_case, "opencv": opencv_case, "numba-workqueue": numba_workqueue_case,
    "torch-intra-op": torch_intra_op_case, "scipy-fft": scipy_fft_case,
    "duckdb": duckdb_case, "duckdb-async-threads-0": lambda: duckdb_case(remedy=True),
    "onnxruntime": onnxruntime_case, "onnxruntime-parallel": lambda: onnxruntime_case("ORT_PARALLEL"),
}
BEFORE_CASE = {int(tid) for tid in os.listdir("/proc/self/task")}
MARKER, work = CASES[CASE]()


class UsesTheLibrary(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[object, bool, int]:
        return work(index), os.getpid() != PARENT, busy_threads(MARKER)


def run(loader: str) -> dict:
    loader_type = torch.utils.data.DataLoader if loader == "torch" else safeloader.DataLoader
    options: dict = {"timeout": 10} if loader == "torch" else {}
    items: list = []
    error = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iterator = None
        try:
            iterator = iter(loader_type(UsesTheLibrary(), batch_size=None, num_workers=2, **options))
            items = list(iterator)
        except Exception as exc:  # torch's timeout, or safeloader's refusal
            error = f"{type(exc).__name__}: {exc}"
            for worker in getattr(iterator, "_workers", ()):
                worker.kill()  # hung: torch's shutdown would wait 5 s for each before killing it
    warned = [str(w.message) for w in caught if issubclass(w.category, safeloader.UnsafeForkWarning)]
    return {
        "loader": loader, "items": [[value, forked] for value, forked, _ in items],
        "worker_threads": [threads for _, _, threads in items], "warnings": warned, "error": error,
    }


expected = [work(i) for i in range(4)]
# A pool thread still running when asked cannot be attributed to its library (its stack is read
# from /proc only while it waits), and on a loaded machine it can wait for a CPU for seconds; the
# calling thread may also have run every task of a small query alone. So: asked again every 0.2 s
# for up to 20 s, the work repeated every 2 s, until the pool's threads are seen to have taken CPU
# (run_case checks it).
for attempt in range(100):
    if busy_threads(MARKER, BEFORE_CASE):
        break
    if attempt % 10 == 9:
        work(0)
    time.sleep(0.2)
time.sleep(0.3)  # the pool idle, as between the steps of a program (some threads spin a while first)
parent_threads = busy_threads(MARKER, BEFORE_CASE)
for loader in LOADER.split(","):
    result = {"parent_threads": parent_threads, "expected": expected, **run(loader)}
    print(json.dumps(result, default=lambda value: value.tolist() if hasattr(value, "tolist") else str(value)))
    sys.stdout.flush()
