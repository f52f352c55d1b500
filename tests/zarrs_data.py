"""Small zarr arrays for the zarrs backend's tests: plain and sharded, compressed, known content.

Usable from a test process and from ``run_python`` children (``tests`` is on
the path there when the child runs with the repository as working directory).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SHAPE = (256, 256)
CHUNKS = (64, 64)  # plain: 16 chunks
SHARDS = (128, 128)  # sharded: 4 shards of 16 inner 32x32 chunks
INNER_CHUNKS = (32, 32)
ZARRS_PIPELINE = "zarrs.ZarrsCodecPipeline"


def expected(shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    """The content every test array is written with: distinct, non-trivial values."""
    count = int(np.prod(shape))
    return (np.arange(count, dtype=np.float32) * 0.5 - 7.0).reshape(shape)


def write_arrays(root: Path | str, shape: tuple[int, ...] = SHAPE) -> dict[str, str]:
    """Write a plain and a sharded array under ``root``; returns kind -> path."""
    import zarr
    from zarr.codecs import ZstdCodec

    root = Path(root)
    paths = {"plain": str(root / "plain.zarr"), "sharded": str(root / "sharded.zarr")}
    with zarrs_pipeline():
        plain = zarr.create_array(
            paths["plain"], shape=shape, chunks=CHUNKS, dtype="f4", compressors=ZstdCodec(level=1), overwrite=True
        )
        plain[:] = expected(shape)
        sharded = zarr.create_array(
            paths["sharded"],
            shape=shape,
            chunks=INNER_CHUNKS,
            shards=SHARDS,
            dtype="f4",
            compressors=ZstdCodec(level=1),
            overwrite=True,
        )
        sharded[:] = expected(shape)
    return paths


@contextlib.contextmanager
def zarrs_pipeline() -> Iterator[None]:
    """zarr configured to decode with zarrs' Rust pipeline inside the block."""
    import zarr
    import zarrs  # noqa: F401  (registers the pipeline)

    with zarr.config.set({"codec_pipeline.path": ZARRS_PIPELINE}):
        yield
