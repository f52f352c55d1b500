"""A thread is still importing a module when a loader forks its 2 workers, longer than
safeloader waits for it (IMPORT_WAIT_SECONDS, lowered here), and the workers import it too.

argv: a directory for the module. Prints the items (each worker's own import of the
module, by process id), then the warnings, one per line.
"""

import os
import sys
import threading
import warnings
from pathlib import Path

import torch

import safeloader
from safeloader import _import_locks

directory = Path(sys.argv[1])
# The module says when its import has begun (an event of this script's), then takes 2 s.
(directory / "very_slow_to_import.py").write_text(
    "import os, sys, time\nsys.modules['__main__'].importing.set()\ntime.sleep(2)\nPID = os.getpid()\n"
)
sys.path.insert(0, str(directory))
_import_locks.IMPORT_WAIT_SECONDS = 0.3


class ImportsInTheWorker(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> str:
        import very_slow_to_import

        assert very_slow_to_import.PID == os.getpid(), "the worker uses the parent's half-imported module"
        return f"{index} imported in its worker"


importing = threading.Event()
importer = threading.Thread(target=lambda: __import__("very_slow_to_import"))
importer.start()
assert importing.wait(30)  # the thread is inside the import now
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(sorted(safeloader.DataLoader(ImportsInTheWorker(), batch_size=None, num_workers=2)), flush=True)
for warning in caught:
    print(f"{warning.category.__name__}: {warning.message}")
importer.join()
