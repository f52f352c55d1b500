"""A thread is still importing a module when a loader forks its 2 workers, and the workers
import it too. The forks do not wait for it (they waited up to 5 s each before issue 42).

argv: a directory for the module. Prints whether the import was still running once the workers
were forked, the items (each worker's own import of the module, by process id), then the
warnings, one per line.
"""

import os
import sys
import threading
import warnings
from pathlib import Path

import torch

import safeloader

directory = Path(sys.argv[1])
# The module says when its import has begun (an event of this script's), then takes 3 s.
(directory / "very_slow_to_import.py").write_text(
    "import os, sys, time\nsys.modules['__main__'].importing.set()\ntime.sleep(3)\nPID = os.getpid()\n"
)
sys.path.insert(0, str(directory))


class ImportsInTheWorker(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> str:
        import very_slow_to_import

        assert very_slow_to_import.PID == os.getpid(), "the worker uses the parent's half-imported module"
        return f"{index} imported in its worker"


importing = threading.Event()
importer = threading.Thread(target=lambda: __import__("very_slow_to_import"), name="importer")
importer.start()
assert importing.wait(30)  # the thread is inside the import now
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    iterator = iter(safeloader.DataLoader(ImportsInTheWorker(), batch_size=None, num_workers=2))
    print("still importing once forked:", importer.is_alive(), flush=True)
    print(sorted(iterator), flush=True)
for warning in caught:
    print(f"{warning.category.__name__}: {warning.message}")
importer.join()
