/*
 * The census of this process's OS threads: thread_ids() and threads_within().
 *
 * Why native: Python's threading module knows only the threads it started; the kernel lists
 * every one in /proc/self/task, also those a native library started (Rust/rayon, OpenMP,
 * OpenBLAS, gloo...), which the fork safety checks and the stall report must see.
 * threads_within checks the list against an earlier one without allocating (proc_entries.c),
 * between a loader start's forks, where each allocation copies a page the workers share.
 */
#include "native.h" /* first: Python.h */

#include <dirent.h>
#include <stdlib.h>

/* Thread ids in /proc/self/task are decimal numbers. */
#define TID_BASE 10

PyObject *sl_thread_ids(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "/proc/self/task");
    PyObject *result = PyList_New(0);
    if (result == NULL) { closedir(dir); return NULL; }
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        char *end;
        long tid = strtol(entry->d_name, &end, TID_BASE);
        if (entry->d_name[0] == '\0' || *end != '\0' || sl_own_thread(tid)) continue;  /* "." and "..", ours */
        PyObject *value = PyLong_FromLong(tid);
        if (value == NULL || PyList_Append(result, value) < 0) {
            Py_XDECREF(value); Py_DECREF(result); closedir(dir); return NULL;
        }
        Py_DECREF(value);
    }
    closedir(dir);
    if (PyList_Sort(result) < 0) { Py_DECREF(result); return NULL; }
    return result;
}

/* threads_within(known) -> bool: whether every thread of this process now is in `known`, a sorted
 * tuple of thread ids (thread_ids() of an earlier call; threads that ended since do not count).
 * Allocates nothing (sl_each_proc_entry), and `known` is only read. */
struct within {
    PyObject *known;
    int within;
};

static int tid_known(long tid, int Py_UNUSED(own), void *data) {
    struct within *check = data;
    if (sl_own_thread(tid)) return 1;
    Py_ssize_t low = 0, high = PyTuple_GET_SIZE(check->known);
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        long value = PyLong_AsLong(PyTuple_GET_ITEM(check->known, middle));
        if (value == -1 && PyErr_Occurred()) return -1;
        if (value == tid) return 1;
        if (value < tid) low = middle + 1;
        else high = middle;
    }
    check->within = 0;
    return 0;
}

int sl_threads_within(PyObject *known) {
    struct within check = {known, 1};
    if (sl_each_proc_entry("/proc/self/task", tid_known, &check) < 0) return -1;
    return check.within;
}

PyObject *sl_threads_within_py(PyObject *Py_UNUSED(self), PyObject *known) {
    if (!PyTuple_Check(known)) {
        PyErr_Format(PyExc_TypeError, "threads_within: known must be a tuple, got %.100s", Py_TYPE(known)->tp_name);
        return NULL;
    }
    int within = sl_threads_within(known);
    return within < 0 ? NULL : PyBool_FromLong(within);
}
