/* A loader start's later worker forks, recognised and checked in C: see fast_fork.c. */
#ifndef SAFELOADER_FAST_FORK_H
#define SAFELOADER_FAST_FORK_H

/* Python.h, and the allocation-free checks of this process's threads, descriptors and loaded
 * objects that the fast path makes (threads.c, descriptors.c, loaded_objects.c). */
#include "native.h"

/* pthread_atfork child handler: hands the fork under way to sl_fast_fork_in_child, forgets the rest. */
void sl_fast_fork_on_child(void);

PyObject *sl_fast_fork_arm(PyObject *self, PyObject *args);
PyObject *sl_fast_fork_disarm(PyObject *self, PyObject *unused);
PyObject *sl_fast_fork_before(PyObject *self, PyObject *unused);
PyObject *sl_fast_fork_after_in_parent(PyObject *self, PyObject *unused);
PyObject *sl_fast_fork_in_child(PyObject *self, PyObject *unused);
PyObject *sl_fast_fork_python_fork(PyObject *self, PyObject *open);

#endif
