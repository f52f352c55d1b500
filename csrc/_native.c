/*
 * safeloader._native: what Python cannot see cheaply about fork and threads.
 *
 * - fork_generation(): a counter bumped by a pthread_atfork child handler, so
 *   it counts every fork of this process, also forks that bypass os.fork
 *   (a C library calling fork() directly), which os.register_at_fork misses.
 * - thread_ids(): the kernel thread ids of every OS thread of this process,
 *   read from /proc/self/task, including threads Python did not start
 *   (Rust/rayon, OpenMP, OpenBLAS, gloo...).
 * - install_backtrace_handler() / signal_thread(): signal-safe native
 *   backtraces of a stuck worker's threads, for the stall watchdog
 *   (backtrace.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backtrace.h"

static volatile unsigned long fork_generation_value = 0;

static void on_fork_child(void) { fork_generation_value++; }

static PyObject *fork_generation(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLong(fork_generation_value);
}

static PyObject *thread_ids(PyObject *self, PyObject *unused) {
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "/proc/self/task");
    PyObject *result = PyList_New(0);
    if (result == NULL) { closedir(dir); return NULL; }
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        char *end;
        long tid = strtol(entry->d_name, &end, 10);
        if (entry->d_name[0] == '\0' || *end != '\0') continue;  /* "." and ".." */
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

/* Every open descriptor as (fd, st_mode, st_dev, st_ino), for the fork hooks that must
 * know what a worker inherited. In C because a worker runs it right after the fork:
 * os.fstat builds a ~20-field stat_result per descriptor, and each allocation there
 * writes to pages shared with the parent (a copy-on-write fault each). */
static PyObject *list_descriptors(int offsets);

static PyObject *descriptor_table(PyObject *self, PyObject *unused) { return list_descriptors(0); }

/* (fd, st_dev, st_ino, offset) of every descriptor open on a regular file that can seek: what
 * the parent records before each worker fork. In C also so that the GIL is held throughout:
 * os.lseek releases it per file, and another Python thread may then keep it for milliseconds. */
static PyObject *regular_file_offsets(PyObject *self, PyObject *unused) { return list_descriptors(1); }

static PyObject *list_descriptors(int offsets) {
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "/proc/self/fd");
    int own = dirfd(dir);
    PyObject *result = PyList_New(0);
    if (result == NULL) { closedir(dir); return NULL; }
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        char *end;
        long fd = strtol(entry->d_name, &end, 10);
        if (entry->d_name[0] == '\0' || *end != '\0' || fd == own) continue;  /* ".", "..", the listing's own */
        struct stat st;
        if (fstat((int)fd, &st) != 0) continue;  /* closed meanwhile */
        PyObject *item;
        if (offsets) {
            if (!S_ISREG(st.st_mode)) continue;
            off_t offset = lseek((int)fd, 0, SEEK_CUR);
            if (offset < 0) continue;  /* cannot seek: the worker reads its own offset */
            item = Py_BuildValue("(lKKL)", fd, (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                                 (long long)offset);
        } else {
            item = Py_BuildValue("(lIKK)", fd, (unsigned int)st.st_mode, (unsigned long long)st.st_dev,
                                 (unsigned long long)st.st_ino);
        }
        if (item == NULL || PyList_Append(result, item) < 0) {
            Py_XDECREF(item); Py_DECREF(result); closedir(dir); return NULL;
        }
        Py_DECREF(item);
    }
    closedir(dir);
    PyObject *table = PyList_AsTuple(result);
    Py_DECREF(result);
    return table;
}

/* SIGCONT: when the process was last continued after a stop (Ctrl-Z, SIGSTOP),
 * on CLOCK_MONOTONIC (Python's time.monotonic). The stall watchdog does not count
 * time spent stopped. Written by a signal handler: a plain double store. */
static volatile double last_continued_value = 0.0;
static struct sigaction previous_cont_action;
static int cont_handler_installed = 0;

static void on_continue(int signum, siginfo_t *info, void *context) {
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) == 0)
        last_continued_value = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    /* Chain to a handler that was there before ours. */
    if (previous_cont_action.sa_flags & SA_SIGINFO) {
        if (previous_cont_action.sa_sigaction != NULL) previous_cont_action.sa_sigaction(signum, info, context);
    } else if (previous_cont_action.sa_handler != SIG_DFL && previous_cont_action.sa_handler != SIG_IGN &&
               previous_cont_action.sa_handler != NULL) {
        previous_cont_action.sa_handler(signum);
    }
}

static PyObject *install_continue_handler(PyObject *self, PyObject *unused) {
    if (!cont_handler_installed) {
        struct sigaction action;
        memset(&action, 0, sizeof(action));
        action.sa_sigaction = on_continue;
        action.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGCONT, &action, &previous_cont_action) != 0) return PyErr_SetFromErrno(PyExc_OSError);
        cont_handler_installed = 1;
    }
    Py_RETURN_TRUE;
}

static PyObject *last_continued(PyObject *self, PyObject *unused) {
    return PyFloat_FromDouble(last_continued_value);
}

static PyObject *install_backtrace_handler(PyObject *self, PyObject *args) {
    int signum, fd;
    if (!PyArg_ParseTuple(args, "ii:install_backtrace_handler", &signum, &fd)) return NULL;
    if (sl_install_backtrace_handler(signum, fd) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_TRUE;
}

static PyObject *signal_thread(PyObject *self, PyObject *args) {
    int pid, tid, signum;
    if (!PyArg_ParseTuple(args, "iii:signal_thread", &pid, &tid, &signum)) return NULL;
    if (sl_signal_thread(pid, tid, signum) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fork_generation", fork_generation, METH_NOARGS,
     "Number of forks this process descends from since the module was loaded "
     "(counted by a pthread_atfork child handler)."},
    {"thread_ids", thread_ids, METH_NOARGS,
     "Sorted kernel thread ids of every OS thread of this process."},
    {"descriptor_table", descriptor_table, METH_NOARGS,
     "Every open descriptor of this process as (fd, st_mode, st_dev, st_ino), in listing order."},
    {"regular_file_offsets", regular_file_offsets, METH_NOARGS,
     "(fd, st_dev, st_ino, offset) of every descriptor open on a seekable regular file, in listing order."},
    {"install_continue_handler", install_continue_handler, METH_NOARGS,
     "install_continue_handler() -> True: record the time of each SIGCONT (chaining a previous handler)."},
    {"last_continued", last_continued, METH_NOARGS,
     "time.monotonic() of the last SIGCONT since install_continue_handler(), 0.0 if none."},
    {"install_backtrace_handler", install_backtrace_handler, METH_VARARGS,
     "install_backtrace_handler(signum, fd) -> True: on `signum`, the receiving thread "
     "writes its native backtrace (library and symbol of each frame) to `fd`, "
     "from a signal-safe handler."},
    {"signal_thread", signal_thread, METH_VARARGS,
     "signal_thread(pid, tid, signum): send `signum` to one thread of a process (tgkill)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "safeloader._native", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (pthread_atfork(NULL, NULL, on_fork_child) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
        return NULL;
    }
    return PyModule_Create(&module);
}
