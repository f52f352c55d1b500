"""In a worker: every zarrs pipeline decodes through the worker's chosen mode (why: docs/internals.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import ZarrsStoreError

_BUILT_IN = "_safeloader_built_in"  # pid of the process whose configuration built ``impl``
_READY_IN = "_safeloader_ready_in"  # pid of the process that brought the pipeline up to date
_DELEGATE = "_safeloader_python_pipeline"  # zarr-python pipeline standing in, if any

# zarrs passes these store types to Rust by class name; only LocalStore is a plain file.
LOCAL_STORE = "LocalStore"


class _State:
    def __init__(self) -> None:
        self.mode: str | None = None  # the mode of the worker with pid ``pid``
        self.pid = 0
        self.originals: dict[str, Callable[..., Any]] = {}  # zarrs' own methods, once patched


_state = _State()


def worker_mode() -> str | None:
    """The zarrs mode in force in this worker; None outside DataLoader workers."""
    return _state.mode if _state.pid == os.getpid() else None


def patch() -> None:
    """Patch zarrs' pipeline class, once per process. In the parent, before its first worker fork:
    a worker then writes no page of the class (a patched type's caches and its subclasses'), and
    the patched methods do what zarrs' own do wherever no mode is active (a process not a worker)."""
    pipeline = sys.modules["zarrs.pipeline"].ZarrsCodecPipeline
    if not _state.originals:
        _state.originals = {name: pipeline.__dict__[name] for name in ("__init__", "__setstate__", "read", "write")}
        pipeline.__init__ = _init
        pipeline.__setstate__ = _setstate
        pipeline.read = _read
        pipeline.write = _write


def activate(mode: str) -> None:
    """In a worker: set the mode every zarrs pipeline follows (patching the class if the parent did not)."""
    if not _state.originals:
        patch()
    _state.mode = mode
    _state.pid = os.getpid()


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    _state.originals["__init__"](self, *args, **kwargs)
    self.__dict__[_BUILT_IN] = os.getpid()


def _setstate(self: Any, state: Any) -> None:
    _state.originals["__setstate__"](self, state)
    self.__dict__[_BUILT_IN] = os.getpid()


async def _read(self: Any, *args: Any, **kwargs: Any) -> None:
    delegate = _prepare(self)
    if delegate is not None:
        return await delegate.read(*args, **kwargs)
    return await _state.originals["read"](self, *args, **kwargs)


async def _write(self: Any, *args: Any, **kwargs: Any) -> None:
    delegate = _prepare(self)
    if delegate is not None:
        return await delegate.write(*args, **kwargs)
    return await _state.originals["write"](self, *args, **kwargs)


def _prepare(pipeline: Any) -> Any:
    """Bring ``pipeline`` up to date for this process (on zarr's event-loop thread, no ``await`` in between);
    the zarr-python pipeline to use instead, if any."""
    here = os.getpid()
    state = pipeline.__dict__
    if state.get(_READY_IN) == here:
        return state.get(_DELEGATE)
    delegate = None
    mode = _state.mode if _state.pid == here else None
    if mode == "python":
        delegate = python_pipeline(pipeline.metadata)
    elif mode is not None and pipeline.impl is not None:
        store_type = type(pipeline.store).__name__
        if mode == "serial" and store_type != LOCAL_STORE:
            # zarrs reads such stores through a static tokio runtime that a
            # forked worker inherits without its threads: it would hang. (The
            # worker's own copy of the extension in "pool" mode has a fresh one.)
            raise ZarrsStoreError(
                f"safeloader: zarrs cannot read {pipeline.store!r} (a {store_type}) in a forked DataLoader "
                f"worker (pid {here}) with zarrs_mode='serial': its HTTP/object-store client runs on a "
                "process-wide async runtime that does not survive fork. Use zarrs_mode='pool' (the default)."
            )
        if state.get(_BUILT_IN) != here:
            pipeline.impl = _rebuild_impl(pipeline)
    state[_DELEGATE] = delegate
    state[_READY_IN] = here
    return delegate


def _rebuild_impl(pipeline: Any) -> Any:
    from zarr.core.config import config

    # Looked up now: in pool mode zarrs.pipeline's CodecPipelineImpl is the worker's copy.
    build = sys.modules["zarrs.pipeline"].get_codec_pipeline_impl
    return build(pipeline.metadata, pipeline.store, strict=config.get("codec_pipeline.strict", False))


def python_pipeline(metadata: Any) -> Any:
    """zarr-python's own pipeline for an array with ``metadata`` (as zarr builds it)."""
    from zarr.core.codec_pipeline import BatchedCodecPipeline
    from zarr.core.metadata import ArrayV3Metadata

    if isinstance(metadata, ArrayV3Metadata):
        codecs = list(metadata.codecs)
    else:
        from zarr.codecs._v2 import V2Codec

        codecs = [V2Codec(filters=metadata.filters, compressor=metadata.compressor)]
    return BatchedCodecPipeline.from_codecs(codecs)
