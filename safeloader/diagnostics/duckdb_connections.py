"""DuckDB's live connections and their async I/O threads: whether a forked worker's query would
wait for threads it does not have (why: docs/internals.md, ``safeloader.diagnostics.duckdb_connections``)."""

from __future__ import annotations

import gc
import sys
from typing import Any

__all__ = ["async_threads", "without_async_threads"]


def async_threads() -> list[int | None]:
    """``async_threads`` of each open DuckDB connection alive in this process (None where it cannot
    be read); empty when DuckDB is not imported. One pass over the objects the collector tracks (a
    few ms in a large program), made only where DuckDB's threads are live at a loader start."""
    connection_type = getattr(sys.modules.get("duckdb"), "DuckDBPyConnection", None)
    if not isinstance(connection_type, type):
        return []
    found: list[int | None] = []
    for candidate in gc.get_objects():
        if isinstance(candidate, connection_type):
            connection: Any = candidate
            try:
                cursor = connection.cursor()
            except Exception:  # closed: its database, if still open, has other connections
                continue
            try:
                row = cursor.execute("SELECT current_setting('async_threads')").fetchone()
                found.append(int(row[0]))
            except Exception:  # a release without the setting, or a database being closed
                found.append(None)
            finally:
                cursor.close()
    return found


def without_async_threads() -> bool:
    """Whether DuckDB connections are alive and none of their databases has async I/O threads."""
    found = async_threads()
    return bool(found) and all(threads == 0 for threads in found)
