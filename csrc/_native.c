/*
 * safeloader._native: what Python cannot see cheaply about fork and threads. This file is the
 * module itself: its method table, docstrings and initialisation; each function lives in the
 * file of its job, and native.h declares what they share.
 *
 * - fork_generation.c: fork_generation(), a counter bumped by the process's pthread_atfork
 *   child handler, so it counts every fork of this process, also forks that bypass os.fork
 *   (a C library calling fork() directly), which os.register_at_fork misses.
 * - threads.c: thread_ids(), the kernel thread ids of every OS thread of this process,
 *   read from /proc/self/task, including threads Python did not start
 *   (Rust/rayon, OpenMP, OpenBLAS, gloo...); threads_within() checks them against
 *   an earlier list without allocating (between a loader start's forks).
 * - descriptors.c: descriptor_table() and regular_file_offsets(), what the fork hooks must know
 *   of the open descriptors; descriptor_kinds(), whether a read-only file or a TCP socket is
 *   open, allocating nothing (between a loader start's forks); reserve_descriptor_slots(), grow
 *   the descriptor table ahead of need (safeloader/_fd_table.py).
 * - private_files.c: file_records() and file_offsets(), what the parent records of the regular
 *   files a worker inherits, and privatize_files(), the worker's own open file description of
 *   each read-only one (the "files" hook: a Dataset may hold thousands).
 * - file_locks.c: exclusively_locked(), the descriptions holding an exclusive flock or OFD lock;
 *   read_locks_behind(), lock_reader_identified() and stop_lock_reader(), the parent's thread
 *   reading a start's identities and locks.
 * - proc_entries.c: the allocation-free listing of /proc/self/task and /proc/self/fd that
 *   threads_within and descriptor_kinds share.
 * - signals.c: signal_handler_address() tells whether a signal is free (a handler installed
 *   in C, e.g. by faulthandler, is invisible to signal.getsignal); free_signals() finds such
 *   signals in one call; install_backtrace_handler() / release_backtrace_handler() /
 *   warm_backtrace() / signal_thread(): signal-safe native backtraces of a stuck worker's
 *   threads, for the stall watchdog (backtrace.c), on a signal nobody else holds;
 *   keep_errno(): faulthandler's handler wrapped so that it restores errno.
 * - python_frames.c: python_frames(), the file and function of each Python frame of a thread of
 *   another process (a forked worker), read from outside without a signal; thread_state(), the
 *   calling thread's PyThreadState, which a worker publishes for it; probe_python_frames(), the
 *   interpreter frame's layout found once from two known frames.
 * - loaded_objects.c: loaded_objects(), the dynamic loader's list of loaded objects, walked in C
 *   (no Python callback while the loader's lock is held), with the GIL released
 *   or held as safeloader/_loader_lock.py decides.
 * - code_map.c: code_segments(), the loaded objects' executable segments, and parse_maps(),
 *   /proc/self/maps as lists of bounds and paths (thread attribution, where the kernel cannot
 *   say which mapping holds a stack: PROCMAP_QUERY).
 * - parked_threads.c: stop_if_parked(), OpenBLAS's thread shutdown called only while every other
 *   Python thread waits where it can only get back to the eval loop (the GIL held throughout).
 * - exit_lock.c: exit_handler_lock(), glibc's exit-handler lock, which the child handler
 *   releases when a thread of the parent held it at the fork.
 * - fast_fork.c: fast_fork_*(), a loader start's later worker forks, recognised and checked in C.
 * - Nothing here takes SIGCONT or any other signal for the process's life: the
 *   stall watchdog detects a stop by other means (waitid WCONTINUED).
 *
 * Initialisation is multi-phase (PEP 489): PyInit__native returns the module
 * definition and native_exec (the Py_mod_exec slot) does the per-process
 * set-up, once per process however often the module is executed.
 *
 * Free-threaded Python (Py_mod_gil = Py_MOD_GIL_NOT_USED) and interpreters
 * with their own GIL (Py_mod_multiple_interpreters =
 * Py_MOD_PER_INTERPRETER_GIL_SUPPORTED): both are declared because nothing
 * here relies on a GIL, for these reasons.
 * - The module keeps no Python objects between calls: no module state, no
 *   static types, no cached objects. Each function builds its result from
 *   local values, so interpreters share nothing through it. The one exception
 *   is fast_fork.c's state for a loader start's later forks: references taken
 *   by fast_fork_arm and released by fast_fork_disarm, used only by the thread
 *   and interpreter that armed it, and never armed under a free-threaded build.
 * - The C state is process-wide on purpose (forks, signal dispositions and
 *   threads belong to the process, not to an interpreter), and the GIL never
 *   protected it anyway: signal handlers run on whichever thread the kernel
 *   picks, whoever holds the GIL. Every variable a signal handler or another
 *   thread can touch concurrently is a lock-free C11 atomic (the only shared
 *   objects a signal handler may access, C11 7.14.1.1), asserted where each is
 *   defined: fork_generation.c's fork_generation_value, backtrace.c's output_fd and kept handlers.
 * - No lock is taken around fork(): only a pthread_atfork child handler is
 *   registered, so a fork never waits for this module, nor this module for a
 *   fork of another thread.
 * - The pthread_atfork handler is registered once per process (pthread_once,
 *   fork_generation.c), so re-executing the module (a re-import, another
 *   interpreter) does not count each fork twice.
 * - fork_generation_value is written only in a fork child, by its only thread,
 *   before fork() returns there; nothing else writes it.
 * - install_backtrace_handler from two threads at once: each call stores its
 *   fd atomically and installs the same handler, so one of the two fds wins,
 *   as it would with the calls in either order under the GIL.
 */
#include "native.h" /* first: Python.h */

#include <string.h>

#include "exit_lock.h"
#include "fast_fork.h"

/* ---- the module ----
 * Each docstring starts with its text signature ("name($module, ...)\n--\n\n"),
 * which Python strips from __doc__ and exposes as __text_signature__, so
 * inspect.signature() works on these functions as on the fallback's. */

static PyMethodDef methods[] = {
    {"fork_generation", sl_fork_generation, METH_NOARGS,
     "fork_generation($module, /)\n--\n\n"
     "Number of forks this process descends from since the module was loaded "
     "(counted by a pthread_atfork child handler)."},
    {"thread_ids", sl_thread_ids, METH_NOARGS,
     "thread_ids($module, /)\n--\n\n"
     "Sorted kernel thread ids of every OS thread of this process."},
    {"threads_within", sl_threads_within_py, METH_O,
     "threads_within($module, known, /)\n--\n\n"
     "Whether every thread of this process now is in `known`, a sorted tuple of thread ids "
     "(threads that ended since do not count); allocates nothing."},
    {"descriptor_table", sl_descriptor_table, METH_NOARGS,
     "descriptor_table($module, /)\n--\n\n"
     "Every open descriptor of this process as (fd, st_mode, st_dev, st_ino), in listing order."},
    {"regular_file_offsets", sl_regular_file_offsets, METH_NOARGS,
     "regular_file_offsets($module, /)\n--\n\n"
     "(fd, st_dev, st_ino, offset) of every descriptor open on a seekable regular file, in listing order."},
    {"free_signals", sl_free_signals, METH_O,
     "free_signals($module, count, /)\n--\n\n"
     "Up to `count` real-time signals whose disposition is SIG_DFL, from SIGRTMAX down."},
    {"descriptor_kinds", sl_descriptor_kinds_py, METH_VARARGS,
     "descriptor_kinds($module, until=7, /)\n--\n\n"
     "What kinds of descriptor this process holds, a bitmask: 1 a regular file open read-only, "
     "2 a regular file, 4 an IPv4/IPv6 stream socket; the listing stops once each kind of `until` "
     "is seen (a kind not in `until` may then be missing)."},
    {"reserve_descriptor_slots", sl_reserve_descriptor_slots, METH_O,
     "reserve_descriptor_slots($module, spare, /)\n--\n\n"
     "Grow this process's descriptor table to hold `spare` descriptors above the lowest free number "
     "(capped by the RLIMIT_NOFILE soft limit); the slots asked of the kernel, or 0 where nothing was done."},
    {"file_records", sl_file_records, METH_VARARGS,
     "file_records($module, fds, read_only, /)\n--\n\n"
     "The records (bytes: struct \"=qQQq\" each) of the regular files among `fds` (a tuple; None: every "
     "open descriptor) as (fd, st_dev, st_ino, offset or -1), only those open read-only with `read_only`."},
    {"file_offsets", sl_file_offsets, METH_O,
     "file_offsets($module, records, /)\n--\n\n"
     "`records` (file_records' bytes), each with the offset its descriptor has now (-1: closed, or "
     "cannot seek); st_dev and st_ino as given."},
    {"privatize_files", sl_privatize_files, METH_VARARGS,
     "privatize_files($module, records, skip, virtual_devices, check_locks, paths, lock_states=None, first=0, /)\n--\n\n"
     "(privatized, failed): give each descriptor of `records` (file_records') still open read-only on a "
     "regular file its own open file description, at the recorded offset, under the same number, opened "
     "by its path in `paths` ((fd, bytes) sorted by fd) where that names the same file, else through "
     "/proc/self/fd; "
     "skipped: `skip`, files on `virtual_devices`, descriptions holding an exclusive lock (read with "
     "`check_locks`, or once among a start's workers through `lock_states`, a writable byte a record), "
     "without `check_locks` a number naming another file than its record. Going round from the record "
     "`first`. `failed`: (fd, errno) of those left shared."},
    {"exclusively_locked", sl_exclusively_locked, METH_O,
     "exclusively_locked($module, fds, /)\n--\n\n"
     "The descriptors of `fds` (a tuple) whose open file description holds an exclusive flock or OFD "
     "lock, read from /proc/self/fdinfo."},
    {"read_locks_behind", sl_read_locks_behind, METH_VARARGS,
     "read_locks_behind($module, records, lock_states, /)\n--\n\n"
     "Start a thread writing the identity of each descriptor of `records` (file_records', writable) into "
     "its record, then reading their locks into `lock_states` (a writable byte a record: 1 free, 2 "
     "exclusively locked), as privatize_files does; a capsule that stops and joins it when it goes, or "
     "None where no thread could start."},
    {"stop_lock_reader", sl_stop_lock_reader, METH_O,
     "stop_lock_reader($module, reader, /)\n--\n\n"
     "Stop read_locks_behind's thread (before its next file) and join it."},
    {"lock_reader_identified", sl_lock_reader_identified, METH_O,
     "lock_reader_identified($module, reader, /)\n--\n\n"
     "Wait until read_locks_behind's thread has written each record's identity (st_dev, st_ino)."},
    {"signal_handler_address", sl_signal_handler_address, METH_VARARGS,
     "signal_handler_address($module, signum, /)\n--\n\n"
     "The address of the current handler of `signum` as sigaction() gives it (also one installed "
     "in C, which signal.getsignal does not see): 0 for SIG_DFL, 1 for SIG_IGN."},
    {"exit_handler_lock", sl_exit_handler_lock, METH_NOARGS,
     "exit_handler_lock($module, /)\n--\n\n"
     "(address, held_at_fork): where glibc's exit-handler lock is (0: not found), which each fork "
     "child's handler releases if a thread of the parent held it, and whether it was held when "
     "this process was forked."},
    {"loaded_objects", sl_loaded_objects, METH_VARARGS,
     "loaded_objects($module, full, release_gil, /)\n--\n\n"
     "((adds, subs) or None, names or None): the dynamic loader's load and unload counters and, "
     "with `full`, the names of the loaded objects in load order; the GIL is released during "
     "the walk only with `release_gil`."},
    {"install_backtrace_handler", sl_install_backtrace_handler_py, METH_VARARGS,
     "install_backtrace_handler($module, signum, fd, /)\n--\n\n"
     "install_backtrace_handler(signum, fd) -> True: on `signum`, the receiving thread "
     "writes its native backtrace (library and symbol of each frame) to `fd`, "
     "from a signal-safe handler."},
    {"release_backtrace_handler", sl_release_backtrace_handler_py, METH_VARARGS,
     "release_backtrace_handler($module, signum, /)\n--\n\n"
     "release_backtrace_handler(signum) -> bool: put SIG_DFL back on `signum` if the backtrace "
     "handler is still the one there (a handler installed since is left alone)."},
    {"warm_backtrace", sl_warm_backtrace_py, METH_VARARGS,
     "warm_backtrace($module, release_gil, /)\n--\n\n"
     "Load glibc's unwinder now (backtrace() allocates on its first call), once per process; "
     "forked children inherit it loaded. It dlopens: the GIL is released meanwhile only with "
     "`release_gil` (safeloader/_loader_lock.py)."},
    {"code_segments", sl_code_segments, METH_VARARGS,
     "code_segments($module, release_gil, /)\n--\n\n"
     "((start, end, name), ...): the loaded objects' executable segments, in load order."},
    {"parse_maps", sl_parse_maps, METH_O,
     "parse_maps($module, data, /)\n--\n\n"
     "(all_starts, all_ends, starts, ends, names) from the bytes of /proc/self/maps: every "
     "mapping's bounds, then the bounds and path of each executable mapping of a file."},
    {"stop_if_parked", sl_stop_if_parked, METH_VARARGS,
     "stop_if_parked($module, functions, interpreter, /)\n--\n\n"
     "Call each C function at the addresses `functions` (int f(void)) only where every other Python "
     "thread is blocked in a system call with return addresses only into `interpreter` (bytes paths; "
     "one ending in '/': a directory's files), the GIL held throughout: None, else why not."},
    {"signal_thread", sl_signal_thread_py, METH_VARARGS,
     "signal_thread($module, pid, tid, signum, /)\n--\n\n"
     "signal_thread(pid, tid, signum): send `signum` to one thread of a process (tgkill)."},
    {"keep_errno", sl_keep_errno_py, METH_VARARGS,
     "keep_errno($module, signum, /)\n--\n\n"
     "keep_errno(signum) -> bool: wrap the handler installed on `signum` (faulthandler's) in one "
     "that restores errno; False where no handler is installed there."},
    {"probe_python_frames", sl_probe_python_frames, METH_NOARGS,
     "probe_python_frames($module, /)\n--\n\n"
     "Find, once per process, where an interpreter frame holds its code object and its caller's "
     "frame, from the calling Python function's frame and its caller's (two Python functions, "
     "the first called by the second): whether python_frames can read frames."},
    {"python_frames", sl_python_frames, METH_VARARGS,
     "python_frames($module, pid, thread_state, /)\n--\n\n"
     "[(file, function), ...] of the Python frames of the thread whose PyThreadState lies at "
     "`thread_state` in process `pid` (a fork of this one), innermost first, read from outside "
     "with process_vm_readv; None where they cannot be read."},
    {"thread_state", sl_thread_state, METH_NOARGS,
     "thread_state($module, /)\n--\n\n"
     "The address of the calling thread's PyThreadState."},
    {"fast_fork_arm", sl_fast_fork_arm, METH_VARARGS,
     "fast_fork_arm($module, thread_ids, counters, modules_state, globals, empty, kinds_mask, launch_code, target, "
     "positions, num_workers, launches, clock, gc_state, /)\n--\n\n"
     "Arm the fast path for this thread's later worker forks of a loader start (csrc/fast_fork.c); "
     "False where it cannot be used."},
    {"fast_fork_disarm", sl_fast_fork_disarm, METH_NOARGS,
     "fast_fork_disarm($module, /)\n--\n\n"
     "Forget the fast path armed on this thread; the number of forks that took it."},
    {"fast_fork_before", sl_fast_fork_before, METH_NOARGS,
     "fast_fork_before($module, /)\n--\n\n"
     "In the registry's `before`: whether this fork takes the fast path."},
    {"fast_fork_after_in_parent", sl_fast_fork_after_in_parent, METH_NOARGS,
     "fast_fork_after_in_parent($module, /)\n--\n\n"
     "In the registry's `after_in_parent`: whether the fork now ending took the fast path."},
    {"fast_fork_in_child", sl_fast_fork_in_child, METH_NOARGS,
     "fast_fork_in_child($module, /)\n--\n\n"
     "In a forked child: (worker_id, num_workers) if its fork took the fast path, else None."},
    {"fast_fork_python_fork", sl_fast_fork_python_fork, METH_O,
     "fast_fork_python_fork($module, open, /)\n--\n\n"
     "The registry's Python path opens (True) or closes (False) a fork on this thread."},
    {NULL, NULL, 0, NULL},
};

static int native_exec(PyObject *Py_UNUSED(module)) {
    int error = sl_register_fork_handlers();
    if (error != 0) {
        PyErr_Format(PyExc_OSError, "pthread_atfork failed: %s", strerror(error));
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, native_exec},
#ifdef Py_mod_multiple_interpreters /* Python 3.12+ */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil /* Python 3.13+ */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "safeloader._native",
    .m_doc = "What Python cannot see cheaply about fork and threads: a fork counter that also sees\n"
             "forks bypassing os.fork, the kernel ids of every OS thread, signal dispositions, the\n"
             "loaded objects, and signal-safe native backtraces of a stuck worker's threads.\n"
             "safeloader._native_fallback is the pure-Python stand-in; use safeloader.native.",
    .m_size = 0, /* no per-module state: see the comment at the top of _native.c */
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&module_def); }
