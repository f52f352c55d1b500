"""Libraries whose threads are live in the parent but that are fine under fork: no false alarm.

The parent uses tokenizers (a rayon pool that turns itself off in a forked child), pyarrow
(thread pools Arrow restarts after fork), numcodecs' Blosc (C-Blosc drops its pool in a forked
child), polars (its backend), onnxruntime's default (sequential) session (the calling thread
runs what no intra-op thread took), DuckDB without async I/O threads (its scheduler copes), sqlite, zarr (its asyncio
thread), a logging QueueListener and a tqdm monitor thread; then a safeloader loader with
default arguments reads every one of them in 2 forked workers. Prints ``LIVE <packages owning
live native threads>``, ``ITEMS <list>`` (each item: its values and whether a forked child of this process made it) and
``UNSAFE <n>``: the UnsafeForkWarnings and UnsafeForkErrors raised (0 expected).
"""

import logging
import logging.handlers
import os
import queue
import sqlite3
import sys
import time
import warnings
from pathlib import Path

import duckdb
import numcodecs
import numcodecs.blosc
import numpy as np
import onnxruntime
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import zarr
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, pre_tokenizers
from tqdm import tqdm

import safeloader
import safeloader.diagnostics.native_libraries
import safeloader.diagnostics.thread_owners

directory = Path(sys.argv[1])
tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer.encode_batch(["a b a"] * 10_000)  # large enough for its rayon pool
pq.write_table(pa.table({"x": np.arange(200_000)}), directory / "t.parquet")
array = zarr.open_array(directory / "a.zarr", mode="w", shape=(40,), chunks=(10,), dtype="i8")
array[:] = np.arange(40)
database = directory / "d.sqlite"
with sqlite3.connect(database) as connection:
    connection.execute("create table t (x integer)")
    connection.executemany("insert into t values (?)", [(i,) for i in range(10)])
numcodecs.blosc.use_threads = True  # zarr 3 turns it off at import; a program using numcodecs alone has it
numcodecs.blosc.set_nthreads(2)  # on the main thread, numcodecs then decodes with C-Blosc's global pool
blosc = numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE, blocksize=1 << 16)
chunk = blosc.encode(np.arange(1 << 20, dtype="i8"))  # 8 MB: 128 blocks, so the pool's threads run
weights = numpy_helper.from_array(np.eye(256, dtype=np.float32), "W")
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 256])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 256])], [weights],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 9
options = onnxruntime.SessionOptions()  # the default execution mode: sequential
options.intra_op_num_threads = 2
options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads block: attributed
session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
duck = duckdb.connect()
duck.execute("SET async_threads=0")  # what DuckDB needs to survive fork (test_library_pools_under_fork.py)
duck.execute("create table t as select i % 100 as k, i as v from range(1000000) r(i)")
listener = logging.handlers.QueueListener(queue.Queue())
listener.start()
for _ in tqdm(range(3), mininterval=0, file=open(os.devnull, "w")):  # tqdm's monitor thread
    pass


def values(index: int) -> list[int]:
    tokens = len(tokenizer.encode_batch(["a b a"] * 500)[index % 2].ids)
    arrow = int(pc.sum(pq.read_table(directory / "t.parquet")["x"]).as_py() % 1000)
    frame = int(pl.DataFrame({"a": np.arange(10_000) % 7}).group_by("a").len().height)
    with sqlite3.connect(database) as connection:
        rows = connection.execute("select count(*) from t where x < ?", (index,)).fetchone()[0]
    decoded = int(np.frombuffer(blosc.decode(chunk), dtype="i8")[index * 1000])
    inferred = float(session.run(None, {"x": np.full((2048, 256), index, np.float32)})[0].sum())
    grouped = duck.execute("select sum(v) from t group by k order by k").fetchall()[index][0]
    return [tokens, arrow, frame, rows, int(array[index * 5]), decoded, int(inferred), int(grouped)]


class FineUnderFork(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[list[int], bool]:
        return values(index), os.getppid() == PARENT


PARENT = os.getpid()
expected = [values(i) for i in range(4)]  # every pool is live in the parent now
time.sleep(0.2)  # and idle, as between the steps of a program (rayon's threads spin a while first)
live = safeloader.diagnostics.thread_owners.live_libraries()
print("LIVE", sorted({safeloader.diagnostics.native_libraries.package_of(library) for library in live}))
unsafe = 0
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        items = list(safeloader.DataLoader(FineUnderFork(), batch_size=None, num_workers=2))
    except safeloader.UnsafeForkError as exc:
        items, unsafe = [], 1
        print(exc)
unsafe += sum(issubclass(w.category, safeloader.UnsafeForkWarning) for w in caught)
assert [list(map(int, v)) for v, _ in items] == expected, (items, expected)
print("ITEMS", [(list(map(int, v)), bool(forked)) for v, forked in items])
print("UNSAFE", unsafe)
listener.stop()
