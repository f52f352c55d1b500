"""``safeloader.doctor()`` after a multi-chunk zarrs decode in this process (rayon's pool has started)."""

import os
import tempfile

import numpy as np  # noqa: F401
import zarr
import zarrs  # noqa: F401

zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
path = os.path.join(tempfile.mkdtemp(), "a.zarr")
array = zarr.create_array(path, shape=(4, 128, 128), chunks=(1, 32, 32), dtype="float32")
array[:] = 1.0
assert zarr.open_array(path, mode="r")[0:2].sum() == 2 * 128 * 128  # a multi-chunk decode: rayon's pool starts
import safeloader  # noqa: E402

safeloader.doctor()
