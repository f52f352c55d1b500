"""Pure-Python stand-in for the ``safeloader._native`` C extension: same functions, same answers, a
few gaps (docs/internals.md, ``safeloader._native_fallback``). ``native`` loads this package; each
function lives in the part for its job."""

from __future__ import annotations

from .descriptors import (
    KEPT_STATUS_FLAGS,
    descriptor_kinds,
    descriptor_table,
    exclusively_locked,
    file_offsets,
    file_records,
    lock_reader_identified,
    privatize_files,
    read_locks_behind,
    regular_file_offsets,
    reserve_descriptor_slots,
    stop_lock_reader,
)
from .forks import (
    exit_handler_lock,
    fast_fork_after_in_parent,
    fast_fork_arm,
    fast_fork_before,
    fast_fork_disarm,
    fast_fork_in_child,
    fast_fork_python_fork,
    fork_generation,
    thread_ids,
    threads_within,
)
from .signals import free_signals, keep_errno, signal_handler_address, signal_thread
from .stacks import (
    code_segments,
    install_backtrace_handler,
    loaded_objects,
    parse_maps,
    probe_python_frames,
    python_frames,
    release_backtrace_handler,
    stop_if_parked,
    thread_state,
    warm_backtrace,
)

__all__ = [
    "KEPT_STATUS_FLAGS",  # not a function of the extension: backends._reopen's one list of these flags
    "code_segments",
    "descriptor_kinds",
    "descriptor_table",
    "exclusively_locked",
    "exit_handler_lock",
    "fast_fork_after_in_parent",
    "fast_fork_arm",
    "fast_fork_before",
    "fast_fork_disarm",
    "fast_fork_in_child",
    "fast_fork_python_fork",
    "file_offsets",
    "file_records",
    "fork_generation",
    "free_signals",
    "install_backtrace_handler",
    "keep_errno",
    "loaded_objects",
    "lock_reader_identified",
    "parse_maps",
    "privatize_files",
    "probe_python_frames",
    "python_frames",
    "read_locks_behind",
    "regular_file_offsets",
    "release_backtrace_handler",
    "reserve_descriptor_slots",
    "signal_handler_address",
    "signal_thread",
    "stop_if_parked",
    "stop_lock_reader",
    "thread_ids",
    "thread_state",
    "threads_within",
    "warm_backtrace",
]
