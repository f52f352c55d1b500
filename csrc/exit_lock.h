/* glibc's exit-handler lock, made new in each fork child: see exit_lock.c. */
#ifndef SAFELOADER_EXIT_LOCK_H
#define SAFELOADER_EXIT_LOCK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Once per process, before the child handler is registered: find the lock (or nothing). */
void sl_exit_lock_find(void);
/* pthread_atfork child handler: a lock held at the fork is released. */
void sl_exit_lock_on_child(void);
/* exit_handler_lock(): (the lock's address or 0, whether it was held when this process was forked). */
PyObject *sl_exit_handler_lock(PyObject *self, PyObject *unused);

#endif
