"""onnxruntime's live ``InferenceSession`` objects and how they run: which of its pools a forked
worker meets.

Both of onnxruntime's pools are unnamed threads of its extension, alike from outside. Its
intra-op pool copes with fork: a run in a forked worker, whose pool threads are gone, is done by
the calling thread (checked: 1.32, sequential sessions with 2 to 8 intra-op threads, read
correctly under torch's loader). A session in ``ExecutionMode.ORT_PARALLEL`` also has an inter-op
pool, on which a run in a forked worker waits forever. So the sessions say which it is, read from
their options; nothing is imported (onnxruntime is looked at only when the program imported it).
"""

from __future__ import annotations

import gc
import sys
from typing import Any

__all__ = ["execution_modes", "parallel", "sequential_only"]

SEQUENTIAL = "ORT_SEQUENTIAL"
PARALLEL = "ORT_PARALLEL"
_SESSIONS = "onnxruntime.capi.onnxruntime_inference_collection"


def execution_modes() -> frozenset[str]:
    """The execution modes ("ORT_SEQUENTIAL", "ORT_PARALLEL") of the sessions alive in this
    process ("?" for one whose options cannot be read); empty when onnxruntime is not imported.

    One pass over the objects the collector tracks (a few ms in a large program), made only where
    onnxruntime's threads are live at a loader start: sessions are found wherever they are held.
    """
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
