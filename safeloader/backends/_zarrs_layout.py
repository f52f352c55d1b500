"""What the zarrs backend relies on in zarr / zarrs-python, checked before a worker is forked: a
mode whose layout differs falls back to the next mode (a wrong guess could hang)."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import inspect
import os
import re
import sys

SUPPORTED_VERSIONS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "zarr": ((3, 1), (3, 5)),
    "zarrs": ((0, 2, 2), (0, 3)),
}
"""Library -> (lowest supported version, first unsupported version). Keep in
step with the ``zarr`` extra in pyproject.toml. Verified, release by release:
zarr 3.1.0-3.1.6, 3.2.0-3.2.1, 3.3.0, 3.4.0-3.4.2 with zarrs 0.2.2-0.2.3 (the
names checked below, and zarr calling the pipeline with the same
``read``/``write`` arguments and building it with ``from_codecs`` /
``from_array_metadata_and_store``). A newer release falls back until checked."""

# Names zarrs-python binds with ``from ._internal import X``: a fresh copy of
# the extension must replace each of them (checked, not assumed).
INTERNAL_BINDINGS = (("zarrs.pipeline", "CodecPipelineImpl"), ("zarrs.utils", "ChunkItem"))
PIPELINE_FIELDS = ("metadata", "store", "impl", "python_impl")


def parse_version(text: str) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups(default="0"))


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def version_problem(library: str) -> str | None:
    """Why ``library``'s installed version is outside ``SUPPORTED_VERSIONS``, or None."""
    module = sys.modules.get(library)
    text = getattr(module, "__version__", None)
    low, high = SUPPORTED_VERSIONS[library]
    version = parse_version(text) if isinstance(text, str) else None
    if version is None or not (low <= version < high):
        return f"{library} must be >={dotted(low)},<{dotted(high)}, got {text!r}"
    return None


def python_mode_problem() -> str | None:
    """Why zarr-python's own pipeline cannot stand in for zarrs' in a worker, or None."""
    try:
        from zarr.core.codec_pipeline import BatchedCodecPipeline
        from zarr.core.metadata import ArrayV2Metadata, ArrayV3Metadata  # noqa: F401
    except ImportError as exc:
        return f"zarr's BatchedCodecPipeline must be importable, got {type(exc).__name__}: {exc}"
    pipeline = _zarrs_pipeline_class()
    if pipeline is None:
        return "zarrs.pipeline.ZarrsCodecPipeline must exist"
    for name in ("read", "write"):
        if not inspect.iscoroutinefunction(getattr(pipeline, name, None)):
            return f"ZarrsCodecPipeline.{name} must be an async method"
        if not inspect.iscoroutinefunction(getattr(BatchedCodecPipeline, name, None)):
            return f"BatchedCodecPipeline.{name} must be an async method"
    if not callable(getattr(BatchedCodecPipeline, "from_codecs", None)):
        return "BatchedCodecPipeline.from_codecs must exist"
    return None


def serial_mode_problem() -> str | None:
    """Why zarrs' Rust codec cannot be rebuilt to decode on the calling thread, or None."""
    for library in ("zarr", "zarrs"):
        problem = version_problem(library)
        if problem is not None:
            return problem
    pipeline = _zarrs_pipeline_class()
    if pipeline is None or not dataclasses.is_dataclass(pipeline):
        return "zarrs.pipeline.ZarrsCodecPipeline must be a dataclass"
    fields = {field.name for field in dataclasses.fields(pipeline)}
    missing = [name for name in PIPELINE_FIELDS if name not in fields]
    if missing:
        return f"ZarrsCodecPipeline must have fields {PIPELINE_FIELDS}, got {sorted(fields)}"
    public = sys.modules.get("zarrs")
    subclass = getattr(public, "ZarrsCodecPipeline", None)
    if isinstance(subclass, type) and subclass is not pipeline:
        # zarrs.ZarrsCodecPipeline is a bare subclass; patches on the base must reach it.
        overridden = {"__init__", "__setstate__", "read", "write"} & set(vars(subclass))
        if overridden:
            return f"zarrs.ZarrsCodecPipeline must not override {sorted(overridden)}"
    build = getattr(sys.modules.get("zarrs.pipeline"), "get_codec_pipeline_impl", None)
    if build is None:
        return "zarrs.pipeline.get_codec_pipeline_impl must exist"
    parameters = inspect.signature(build).parameters
    if list(parameters)[:2] != ["metadata", "store"] or "strict" not in parameters:
        return f"get_codec_pipeline_impl must take (metadata, store, *, strict), got {inspect.signature(build)}"
    return python_mode_problem()


def pool_mode_problem() -> str | None:
    """Why a private copy of zarrs' extension cannot be loaded in a worker, or None."""
    problem = serial_mode_problem()
    if problem is not None:
        return problem
    if not hasattr(os, "memfd_create"):
        return "os.memfd_create must be available (Linux)"
    internal = sys.modules.get("zarrs._internal")
    loader = getattr(getattr(internal, "__spec__", None), "loader", None)
    if not isinstance(loader, importlib.machinery.ExtensionFileLoader):
        return f"zarrs._internal must be an extension module, got {internal!r}"
    path = getattr(internal, "__file__", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return f"zarrs._internal must be loaded from a file, got {path!r}"
    for module_name, name in INTERNAL_BINDINGS:
        bound = getattr(sys.modules.get(module_name), name, None)
        if bound is None or bound is not getattr(internal, name, None):
            return f"{module_name}.{name} must be zarrs._internal.{name}, got {bound!r}"
    return None


MODE_PROBLEMS = {"pool": pool_mode_problem, "serial": serial_mode_problem, "python": python_mode_problem}


def _zarrs_pipeline_class() -> type | None:
    cls = getattr(sys.modules.get("zarrs.pipeline"), "ZarrsCodecPipeline", None)
    return cls if isinstance(cls, type) else None
