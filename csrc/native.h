/* What the files of safeloader._native share: each file's functions that _native.c's method
 * table lists, and the C-level checks fast_fork.c makes. See _native.c for which file holds what.
 * Include this header first: Python.h must come before any system header (its pyconfig.h
 * defines _GNU_SOURCE, which dl_iterate_phdr, O_PATH and syscall() need). */
#ifndef SAFELOADER_NATIVE_H
#define SAFELOADER_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Python-facing functions are named sl_<the Python name>, or sl_<the Python name>_py where a
 * C-level function already has that name (the one fast_fork.c calls, backtrace.h's). */

/* fork_generation.c: the process's pthread_atfork child handler and its fork counter. */
int sl_register_fork_handlers(void); /* once per process: 0, or pthread_atfork's error number */
PyObject *sl_fork_generation(PyObject *self, PyObject *unused);

/* proc_entries.c: the numbered entries of a /proc directory, allocating nothing. Each number is
 * given to `visit(number, own, data)` (`own`: the listing's own descriptor) until it returns 0
 * (stop) or -1 (a Python error set). Returns 0, or -1 with a Python error set. */
int sl_each_proc_entry(const char *path, int (*visit)(long, int, void *), void *data);

/* threads.c: the census of this process's OS threads. */
int sl_threads_within(PyObject *known); /* 1, 0, or -1 with an exception set */
PyObject *sl_thread_ids(PyObject *self, PyObject *unused);
PyObject *sl_threads_within_py(PyObject *self, PyObject *known);

/* descriptors.c: this process's descriptor table. */
/* The descriptor_kinds() bitmask, or -1 with an exception set; the listing stops once each kind of
 * `until` is seen (with `any`, once one is), and the kinds not in `until` may then be missing. */
long sl_descriptor_kinds(long until, int any);
PyObject *sl_descriptor_table(PyObject *self, PyObject *unused);
PyObject *sl_regular_file_offsets(PyObject *self, PyObject *unused);
PyObject *sl_descriptor_kinds_py(PyObject *self, PyObject *args);
PyObject *sl_reserve_descriptor_slots(PyObject *self, PyObject *arg);

/* private_files.c: the "files" hook's records of regular files, and a worker's own descriptions of them. */
PyObject *sl_file_records(PyObject *self, PyObject *args);
PyObject *sl_file_offsets(PyObject *self, PyObject *records);
PyObject *sl_privatize_files(PyObject *self, PyObject *args);

/* file_locks.c: whether an open file description holds an exclusive flock or OFD lock. `info`: an
 * open /proc/self/fdinfo (and `name` the descriptor's number), or -1 and `name` the full path. */
int sl_holds_exclusive_lock(int info, const char *name);
PyObject *sl_exclusively_locked(PyObject *self, PyObject *fds);
PyObject *sl_read_locks_behind(PyObject *self, PyObject *args);
PyObject *sl_stop_lock_reader(PyObject *self, PyObject *capsule);
PyObject *sl_lock_reader_identified(PyObject *self, PyObject *capsule);
/* Whether `tid` is one of safeloader's own lock readers (file_locks.c): thread_ids() leaves them out. */
int sl_own_thread(long tid);

/* signals.c: signal dispositions, and the Python face of backtrace.c. */
PyObject *sl_signal_handler_address(PyObject *self, PyObject *args);
PyObject *sl_free_signals(PyObject *self, PyObject *arg);
PyObject *sl_install_backtrace_handler_py(PyObject *self, PyObject *args);
PyObject *sl_release_backtrace_handler_py(PyObject *self, PyObject *args);
PyObject *sl_warm_backtrace_py(PyObject *self, PyObject *args);
PyObject *sl_signal_thread_py(PyObject *self, PyObject *args);
PyObject *sl_keep_errno_py(PyObject *self, PyObject *args);

/* python_frames.c: the Python frames of another process's thread, read from outside. */
PyObject *sl_probe_python_frames(PyObject *self, PyObject *unused);
PyObject *sl_python_frames(PyObject *self, PyObject *args);
PyObject *sl_thread_state(PyObject *self, PyObject *unused);

/* loaded_objects.c: the dynamic loader's list of loaded objects. */
int sl_loaded_counters(unsigned long long *adds, unsigned long long *subs); /* 1, or 0: none */
PyObject *sl_loaded_objects(PyObject *self, PyObject *args);

/* code_map.c: where the loaded code lies in this process's memory. */
PyObject *sl_code_segments(PyObject *self, PyObject *args);
PyObject *sl_parse_maps(PyObject *self, PyObject *arg);

/* parked_threads.c: C functions called only while every other Python thread is parked in the interpreter. */
PyObject *sl_stop_if_parked(PyObject *self, PyObject *args);

#endif
