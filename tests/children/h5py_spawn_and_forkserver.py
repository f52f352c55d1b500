"""h5py, npz and plain-file handles opened in __init__, under spawn and forkserver workers.

argv: the HDF5 file, the npz archive, the records file. Prints what torch's
loader did with spawn, ``OK <method> <items>`` per start method, what a spawn
worker said once the HDF5 file was moved, and whether the parent still reads it.
"""

import os
import sys
import warnings

warnings.simplefilter("ignore")
import numpy as np  # noqa: E402
import torch.utils.data  # noqa: E402

import safeloader  # noqa: E402
from tests.h5py_data import Everything  # noqa: E402


def main() -> None:
    h5, npz, records = sys.argv[1:]
    dataset = Everything(h5, npz, records)
    expected = np.stack([dataset[i][1] for i in range(len(dataset))])
    try:
        list(torch.utils.data.DataLoader(dataset, num_workers=1, multiprocessing_context="spawn"))
        print("TORCH ok")
    except TypeError as exc:
        print("TORCH TypeError", exc)
    for method in ("forkserver", "spawn"):
        # One spawned worker: each imports torch again (a forkserver's workers are forked from it).
        workers = 2 if method == "forkserver" else 1
        loader = safeloader.DataLoader(dataset, batch_size=10, num_workers=workers, multiprocessing_context=method)
        checked = 0
        for index, values in loader:
            assert (values.numpy() == expected[index.numpy()]).all(), method
            checked += len(index)
        print("OK", method, checked)
    os.rename(h5, h5 + ".moved")
    try:
        list(safeloader.DataLoader(dataset, num_workers=1, multiprocessing_context="spawn"))
        print("MOVED no error")
    except OSError as exc:
        print("MOVED", type(exc).__name__, " | ".join(str(exc).splitlines()))
    print("PARENT", (dataset[3][1] == expected[3]).all())


if __name__ == "__main__":  # spawn and forkserver workers run this file again as __mp_main__
    main()
