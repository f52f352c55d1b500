"""The Python threads of an fsspec-style event loop (``fsspec.asyn``; ``zarr.core.sync`` copies it):
its I/O thread and its executors' workers, for the ``hazards`` of the backends of those libraries."""

from __future__ import annotations

import sys
import threading
from typing import Any

from ._backend import Hazard


def hazard(module_name: str, reset: str, hook: str | None) -> Hazard | None:
    """The live threads of ``module_name``'s loop, which its own at-fork handler ``reset`` re-creates
    in a forked child; None where there are none, or where this version has no such handler."""
    module = sys.modules.get(module_name)
    if module is None or not callable(getattr(module, reset, None)):
        return None  # a version without its own at-fork reset: its threads stay unexplained
    threads: list[Any] = [*(getattr(module, "iothread", None) or [])]
    loop = (getattr(module, "loop", None) or [None])[0]
    for executor in (getattr(module, "_executor", None), getattr(loop, "_default_executor", None)):
        threads += list(getattr(executor, "_threads", None) or ())
    me = threading.current_thread()
    idents = {thread.ident for thread in threads if thread is not None}
    live = {t.ident: t.name for t in threading.enumerate() if t.ident and t.ident in idents and t is not me}
    if not live:
        return None
    library = module_name.split(".")[0]
    return Hazard(
        "python threads",
        library,
        f"{len(live)} Python thread(s) of {library}'s event loop and its executor: {', '.join([*live.values()][:10])}",
        hook=hook,
        alone=f"{library}'s own fork handler ({module_name}.{reset}): a worker starts its own event loop and "
        "threads on first use",
        threads=tuple(live),
    )
