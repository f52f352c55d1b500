"""A warm-up thread imports a package of 40 slow modules (0.3 s each) while the main thread runs
3 epochs whose workers never need it (issue 42, item 3).

argv: ``torch`` or ``safeloader`` (whose DataLoader), and a directory for the package. Prints
whether the warm-up was still importing after the 3 epochs, the epochs' items, then the
warnings, one per line; on stderr how long the 3 epochs took. The 12 s import is not waited
for at the end (a daemon thread).
"""

import os
import sys
import threading
import time
import warnings
from pathlib import Path

import torch

import safeloader

which, directory = sys.argv[1], Path(sys.argv[2])
package = directory / "warm_package"
package.mkdir()
modules = [f"part{i}" for i in range(40)]
(package / "__init__.py").write_text("".join(f"from . import {name}\n" for name in modules))
for name in modules:
    (package / f"{name}.py").write_text("import time\ntime.sleep(0.3)\n")
sys.path.insert(0, str(directory))

started = threading.Event()
warm_up = threading.Thread(target=lambda: started.set() or __import__("warm_package"), name="warm-up", daemon=True)
warm_up.start()
assert started.wait(30)
loader_class = torch.utils.data.DataLoader if which == "torch" else safeloader.DataLoader
loader = loader_class(list(range(4)), batch_size=None, num_workers=2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    began = time.monotonic()
    epochs = [sorted(int(item) for item in loader) for _ in range(3)]
    took = time.monotonic() - began
print("still importing after 3 epochs:", warm_up.is_alive(), flush=True)
print(epochs, flush=True)
for warning in caught:
    print(f"{warning.category.__name__}: {warning.message}", flush=True)
print(f"3 epochs took {took:.2f} s", file=sys.stderr, flush=True)  # for the record, not asserted
os._exit(0)  # not waiting for the warm-up's import
