"""A zarr array served over HTTP (an FsspecStore), read in workers in each zarrs mode.

argv: the folder holding plain.zarr. Prints, as JSON, per mode: [equal to the direct read,
the mode the worker used] per item, or the error.
"""

import functools
import http.server
import json
import os
import sys
import threading

import numpy as np
import torch
import zarr
import zarrs  # noqa: F401

import safeloader
from safeloader.backends.zarrs import worker_mode

root = sys.argv[1]
zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/plain.zarr"


class Windows(torch.utils.data.Dataset):
    def __init__(self, open_now):
        self.array = zarr.open_array(url, mode="r") if open_now else None

    def __len__(self):
        return 4

    def __getitem__(self, index):
        if self.array is None:
            self.array = zarr.open_array(url, mode="r")
        return torch.from_numpy(self.array[index * 50 : index * 50 + 90, 20:200]), worker_mode()


opened = Windows(open_now=True)
assert type(opened.array._async_array.codec_pipeline.store).__name__ == "FsspecStore"
reference = opened.array[:]  # the parent decodes over HTTP with zarrs
report = {}
for mode, dataset in (("pool", opened), ("python", Windows(open_now=False)), ("serial", opened)):
    loader = safeloader.DataLoader(dataset, batch_size=None, num_workers=2, zarrs_mode=mode, timeout=20)
    try:
        report[mode] = [
            [bool(np.array_equal(data.numpy(), reference[i * 50 : i * 50 + 90, 20:200])), used]
            for i, (data, used) in enumerate(loader)
        ]
    except Exception as exc:
        report[mode] = f"{type(exc).__name__}: {exc}"
    del loader
print(json.dumps(report), flush=True)
os._exit(0)  # skip interpreter teardown of the HTTP clients' runtimes
