/* A loader start's later worker forks, recognised and checked in C: see fast_fork.c. */
#ifndef SAFELOADER_FAST_FORK_H
#define SAFELOADER_FAST_FORK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* From _native.c: allocation-free checks of this process's threads and descriptors. */
int sl_threads_within(PyObject *known);   /* 1, 0, or -1 with an exception set */
long sl_descriptor_kinds(void);           /* the descriptor_kinds() bitmask, or -1 with an exception set */
int sl_loaded_counters(unsigned long long *adds, unsigned long long *subs);  /* 1, or 0: none */

/* pthread_atfork child handler: hands the fork under way to sl_fast_fork_in_child, forgets the rest. */
void sl_fast_fork_on_child(void);

PyObject *sl_fast_fork_arm(PyObject *self, PyObject *args);
PyObject *sl_fast_fork_disarm(PyObject *self, PyObject *unused);
PyObject *sl_fast_fork_before(PyObject *self, PyObject *unused);
PyObject *sl_fast_fork_after_in_parent(PyObject *self, PyObject *unused);
PyObject *sl_fast_fork_in_child(PyObject *self, PyObject *unused);
PyObject *sl_fast_fork_python_fork(PyObject *self, PyObject *open);

#endif
