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
by_what = {h["what"]: h for h in report["live_at_fork"]}
for w, h in by_what.items():
    if "open npz archive" in w or "open h5py file" in w:
        assert h["status"] == "handled" and h["handled_by"].startswith("hook 'files'"), h
    if "busy-helper" in w:  # a thread holding no lock a worker needs is no hazard by itself
        assert h["status"] == "harmless" and "Not a hazard by itself" in w, h
assert not [h for h in report["live_at_fork"] if h["status"] == "breaks"], report["live_at_fork"]
assert report["summary"].startswith("Nothing to do:"), report["summary"]
print("ok")
