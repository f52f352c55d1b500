"""``safeloader.doctor(file=None)`` with an npz archive, an h5py file and another thread open: prints ``ok``."""

import os
import tempfile
import threading

import h5py
import numpy as np

import safeloader

root = tempfile.mkdtemp()
np.savez(os.path.join(root, "x.npz"), a=np.arange(3))
archive = np.load(os.path.join(root, "x.npz"))
with h5py.File(os.path.join(root, "f.h5"), "w") as f:
    f["x"] = np.arange(3)
handle = h5py.File(os.path.join(root, "f.h5"), "r")
stop = threading.Event()
thread = threading.Thread(target=stop.wait, name="busy-helper")
thread.start()
report = safeloader.doctor(file=None)
stop.set()
thread.join()
what = [h["what"] for h in report["live_at_fork"]]
assert any("open npz archive" in w and "x.npz" in w for w in what), what
assert any("open h5py file" in w and "f.h5" in w for w in what), what
assert any("busy-helper" in w for w in what), what
print("ok")
