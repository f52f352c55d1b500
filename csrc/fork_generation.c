/*
 * The process's one pthread_atfork child handler, and the fork counter it keeps
 * (fork_generation()).
 *
 * Why native: a pthread_atfork child handler runs in every fork of this process,
 * also forks that bypass os.fork (a C library calling fork() directly), which
 * os.register_at_fork misses; and it runs in the child before fork() returns there,
 * before any Python code. The same handler hands the fork to exit_lock.c (glibc's
 * exit-handler lock, released first) and to fast_fork.c (which worker this child is).
 *
 * No lock is taken around fork(): only a child handler is registered, so a fork never
 * waits for this module, nor this module for a fork of another thread. The handler is
 * registered once per process (pthread_once), so re-executing the module (a re-import,
 * another interpreter) does not count each fork twice. fork_generation_value is written
 * only in a fork child, by its only thread, before fork() returns there; nothing else
 * writes it.
 */
#include "native.h" /* first: Python.h */

#include <pthread.h>
#include <stdatomic.h>

#include "exit_lock.h"
#include "fast_fork.h"

/* Lock-free atomics are the only shared objects a signal handler may use
 * (C11 7.14.1.1); a lock-based fallback could deadlock inside the handler. */
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2, "fork_generation_value must be a lock-free atomic");

static atomic_ulong fork_generation_value = 0;

static void on_fork_child(void) {
    sl_exit_lock_on_child(); /* first: another child handler may register an exit handler */
    atomic_fetch_add_explicit(&fork_generation_value, 1, memory_order_relaxed);
    sl_fast_fork_on_child();
}

PyObject *sl_fork_generation(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    return PyLong_FromUnsignedLong(atomic_load_explicit(&fork_generation_value, memory_order_relaxed));
}

/* The fork handler is process-wide: registered once, not once per module
 * execution (a re-import or another interpreter would count each fork twice). */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_error = 0;  /* pthread_atfork's result, written once inside pthread_once */

static void register_fork_handlers(void) {
    sl_exit_lock_find();
    atfork_error = pthread_atfork(NULL, NULL, on_fork_child);
}

int sl_register_fork_handlers(void) {
    pthread_once(&atfork_once, register_fork_handlers);
    return atfork_error;
}
