"""A Dataset using a library that terminates a forked child itself once the parent used it:
numba's parallel functions on its OpenMP threading layer (or, as the control, on its fork-safe
workqueue layer), or a TensorStore array. The parent uses it first; 2 workers read 8 items.

argv: ``numba``, ``numba-workqueue``, ``tensorstore`` or ``tensorstore-at-start`` (each worker
uses TensorStore in ``worker_init_fn`` while the parent's sampler takes a second for its first
index: the worker dies while torch's iterator is still being built); ``torch``, ``safeloader``
(whose DataLoader) or ``safeloader-warn`` (``on_unsafe_fork="warn"``: forked anyway). Prints the
items (``equal to the direct read``, or the error's type and first line), then each warning's
category and first line (but Python 3.12+'s DeprecationWarning on forking a multi-threaded
process).
"""

import os
import sys
import tempfile
import time
import warnings

case, which = sys.argv[1:]
if case == "numba-workqueue":
    os.environ["NUMBA_THREADING_LAYER"] = "workqueue"  # read when numba first runs a parallel function

import numpy as np  # noqa: E402
import torch  # noqa: E402

if case.startswith("numba"):
    from numba import njit, prange

    @njit(parallel=True)
    def total(values):
        sum_ = 0.0
        for i in prange(values.shape[0]):
            sum_ += values[i]
        return sum_

    class Items(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> float:
            return total(np.arange(index * 1000, (index + 1) * 1000, dtype=np.float64))

else:
    import tensorstore

    def spec(path: str) -> dict:
        return {"driver": "zarr", "kvstore": {"driver": "file", "path": path}}

    class Items(torch.utils.data.Dataset):
        def __init__(self, path: str) -> None:
            self.array = tensorstore.open(spec(path)).result()  # opened in the parent, as users do

        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> float:
            return float(self.array[index * 10 : (index + 1) * 10].read().result().sum())


if __name__ == "__main__":  # forkserver workers import this file as __mp_main__
    if case.startswith("tensorstore"):
        path = tempfile.mkdtemp()
        metadata = {"shape": [80, 10], "chunks": [10, 10], "dtype": "<f8"}
        tensorstore.open({**spec(path), "metadata": metadata}, create=True).result().write(
            np.arange(800, dtype=np.float64).reshape(80, 10)
        ).result()
        dataset = Items(path)
    else:
        dataset = Items()
    direct = [dataset[i] for i in range(8)]  # the parent uses the library first
    if which == "torch":
        from torch.utils.data import DataLoader
    else:
        import safeloader
        from safeloader import DataLoader

        if which == "safeloader-warn":
            safeloader.configure(on_unsafe_fork="warn")
    options = {}
    if case == "tensorstore-at-start":

        def slow_first_index():
            time.sleep(1)  # in torch's iterator __init__ (its first prefetch), after the forks
            yield from range(8)

        options = {"sampler": slow_first_index(), "worker_init_fn": lambda worker_id: dataset[0]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            loader = DataLoader(dataset, batch_size=4, num_workers=2, **options)
            items = [float(x) for batch in loader for x in batch]
            print("equal to the direct read" if items == direct else f"wrong: {items} != {direct}")
        except Exception as exc:
            print(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    for warning in caught:
        if issubclass(warning.category, DeprecationWarning):
            continue  # Python 3.12+'s "multi-threaded, use of fork()": torch's loader gets it too
        print(f"{warning.category.__name__}: {str(warning.message).splitlines()[0]}")
