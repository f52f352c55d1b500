"""onnxruntime's live ``InferenceSession`` objects and how they run: which of its pools a forked worker meets.

Why: docs/internals.md, ``safeloader.diagnostics.onnxruntime_sessions``."""

from __future__ import annotations

import gc
import sys
from typing import Any

__all__ = ["execution_modes", "parallel", "sequential_only"]

SEQUENTIAL = "ORT_SEQUENTIAL"
PARALLEL = "ORT_PARALLEL"
_SESSIONS = "onnxruntime.capi.onnxruntime_inference_collection"


def execution_modes() -> frozenset[str]:
    """The execution modes ("ORT_SEQUENTIAL", "ORT_PARALLEL"; "?" unreadable) of this process's live
    sessions; empty when onnxruntime is not imported."""
    session = getattr(sys.modules.get(_SESSIONS), "Session", None)
    if not isinstance(session, type):
        return frozenset()
    modes = set()
    for candidate in gc.get_objects():
        if isinstance(candidate, session):
            found: Any = candidate
            try:
                mode = found.get_session_options().execution_mode
            except Exception:  # a session being torn down, or a release that moved its options
                modes.add("?")
                continue
            modes.add(str(getattr(mode, "name", mode)))
    return frozenset(modes)


def sequential_only() -> bool:
    """Whether sessions are alive and all run sequentially: onnxruntime's threads are intra-op pools."""
    return execution_modes() == {SEQUENTIAL}


def parallel() -> bool:
    """Whether a session alive in this process runs in ``ORT_PARALLEL`` mode (an inter-op pool)."""
    return PARALLEL in execution_modes()
