/*
 * The stall watchdog's signals: which real-time signals are free (free_signals), whose handler
 * holds one (signal_handler_address), and the Python face of backtrace.c, which makes the
 * threads of a stuck worker write their native stacks: its handler installed and released,
 * its unwinder loaded ahead (warm_backtrace), and the signal sent to one thread (signal_thread);
 * keep_errno wraps another handler (faulthandler's) so that it leaves errno as it found it.
 *
 * Why native: sigaction sees what signal.getsignal cannot, a handler installed in C
 * (faulthandler.register, a native library, a profiler); the backtrace handler must be C to be
 * signal-safe; and Python has no call that signals one thread of another process (tgkill).
 */
#include "native.h" /* first: Python.h */

#include <signal.h>

#include "backtrace.h"

/* ---- signal dispositions ---- */

/* The current handler of `signum` as an address: 0 for SIG_DFL, 1 for SIG_IGN.
 * sigaction sees what signal.getsignal cannot: a handler installed in C
 * (faulthandler.register, a native library, a profiler). */
PyObject *sl_signal_handler_address(PyObject *Py_UNUSED(self), PyObject *args) {
    int signum;
    if (!PyArg_ParseTuple(args, "i:signal_handler_address", &signum)) return NULL;
    struct sigaction current;
    if (sigaction(signum, NULL, &current) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    if (current.sa_flags & SA_SIGINFO) return PyLong_FromVoidPtr((void *)current.sa_sigaction);
    if (current.sa_handler == SIG_DFL) return PyLong_FromLong(0);
    if (current.sa_handler == SIG_IGN) return PyLong_FromLong(1);
    return PyLong_FromVoidPtr((void *)current.sa_handler);
}

/* Up to `count` real-time signals whose disposition is SIG_DFL, from SIGRTMAX down (users and
 * libraries mostly take theirs from SIGRTMIN up). sigaction sees every handler: one installed in
 * C (faulthandler's) and Python's own trampoline for a Python-level handler. One call in a fresh
 * worker instead of two per signal from Python (each a page or two copied from the parent). */
PyObject *sl_free_signals(PyObject *Py_UNUSED(self), PyObject *arg) {
    long count = PyLong_AsLong(arg);
    if (count == -1 && PyErr_Occurred()) return NULL;
    PyObject *found = PyList_New(0);
    if (found == NULL) return NULL;
    for (int signum = SIGRTMAX; signum >= SIGRTMIN && PyList_GET_SIZE(found) < count; signum--) {
        struct sigaction current;
        if (sigaction(signum, NULL, &current) != 0) continue;
        if (current.sa_flags & SA_SIGINFO || current.sa_handler != SIG_DFL) continue;
        PyObject *number = PyLong_FromLong(signum);
        if (number == NULL || PyList_Append(found, number) < 0) {
            Py_XDECREF(number);
            Py_DECREF(found);
            return NULL;
        }
        Py_DECREF(number);
    }
    return found;
}

/* ---- native backtraces (backtrace.c) ---- */

PyObject *sl_install_backtrace_handler_py(PyObject *Py_UNUSED(self), PyObject *args) {
    int signum, fd;
    if (!PyArg_ParseTuple(args, "ii:install_backtrace_handler", &signum, &fd)) return NULL;
    if (sl_install_backtrace_handler(signum, fd) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_TRUE;
}

PyObject *sl_release_backtrace_handler_py(PyObject *Py_UNUSED(self), PyObject *args) {
    int signum;
    if (!PyArg_ParseTuple(args, "i:release_backtrace_handler", &signum)) return NULL;
    int released = sl_release_backtrace_handler(signum);
    if (released < 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyBool_FromLong(released);
}

PyObject *sl_warm_backtrace_py(PyObject *Py_UNUSED(self), PyObject *args) {
    int release_gil;
    if (!PyArg_ParseTuple(args, "p:warm_backtrace", &release_gil)) return NULL;
    if (release_gil) {
        Py_BEGIN_ALLOW_THREADS
        sl_warm_backtrace();
        Py_END_ALLOW_THREADS
    } else {
        sl_warm_backtrace();
    }
    Py_RETURN_NONE;
}

PyObject *sl_signal_thread_py(PyObject *Py_UNUSED(self), PyObject *args) {
    int pid, tid, signum;
    if (!PyArg_ParseTuple(args, "iii:signal_thread", &pid, &tid, &signum)) return NULL;
    if (sl_signal_thread(pid, tid, signum) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

PyObject *sl_keep_errno_py(PyObject *Py_UNUSED(self), PyObject *args) {
    int signum;
    if (!PyArg_ParseTuple(args, "i:keep_errno", &signum)) return NULL;
    int kept = sl_keep_errno(signum);
    if (kept < 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyBool_FromLong(kept);
}
