/*
 * safeloader._native: what Python cannot see cheaply about fork and threads.
 *
 * - fork_generation(): a counter bumped by a pthread_atfork child handler, so
 *   it counts every fork of this process, also forks that bypass os.fork
 *   (a C library calling fork() directly), which os.register_at_fork misses.
 * - thread_ids(): the kernel thread ids of every OS thread of this process,
 *   read from /proc/self/task, including threads Python did not start
 *   (Rust/rayon, OpenMP, OpenBLAS, gloo...).
 * - install_continue_handler() / last_continued(): when the process was last
 *   continued after a stop (SIGCONT), so the stall watchdog does not count
 *   time spent stopped.
 * - install_backtrace_handler() / warm_backtrace() / signal_thread(): signal-safe native
 *   backtraces of a stuck worker's threads, for the stall watchdog
 *   (backtrace.c).
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
 *   local values, so interpreters share nothing through it.
 * - The C state is process-wide on purpose (forks, signal dispositions and
 *   threads belong to the process, not to an interpreter), and the GIL never
 *   protected it anyway: signal handlers run on whichever thread the kernel
 *   picks, whoever holds the GIL. Every variable a signal handler or another
 *   thread can touch concurrently is a lock-free C11 atomic (the only shared
 *   objects a signal handler may access, C11 7.14.1.1), asserted below:
 *   fork_generation_value, last_continued_bits, and backtrace.c's output_fd.
 * - The one check-then-act sequence, installing the SIGCONT handler once, is
 *   serialised by install_lock, not by the GIL (without it two concurrent first
 *   calls would both install, and the second would record our own handler as
 *   the one to chain to: endless recursion on SIGCONT). install_lock is also
 *   taken by pthread_atfork's prepare handler and released on both sides of
 *   fork(), so a child never inherits it locked by a thread that does not
 *   exist there; this costs each fork one uncontended lock and unlock.
 * - The pthread_atfork handlers are registered once per process (pthread_once),
 *   so re-executing the module (a re-import, another interpreter) does not
 *   count each fork twice.
 * - fork_generation_value is written only in a fork child, by its only thread,
 *   before fork() returns there; nothing else writes it.
 * - install_backtrace_handler from two threads at once: each call stores its
 *   fd atomically and installs the same handler, so one of the two fds wins,
 *   as it would with the calls in either order under the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backtrace.h"

/* Lock-free atomics are the only shared objects a signal handler may use
 * (C11 7.14.1.1); a lock-based fallback could deadlock inside the handler. */
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2, "fork_generation_value must be a lock-free atomic");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "last_continued_bits must be a lock-free atomic");
_Static_assert(sizeof(unsigned long long) == sizeof(double), "last_continued_bits holds a double's bits");

/* Nanoseconds per second: struct timespec's tv_nsec to seconds. */
#define NANOSECONDS_PER_SECOND 1e9
/* Thread ids in /proc/self/task are decimal numbers. */
#define TID_BASE 10

/* ---- install_lock: serialises installing process-wide handlers. ---- */

static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;

/* pthread_atfork prepare / parent / child: fork() happens with install_lock
 * held by the forking thread, so the child gets it unlocked, not stuck in the
 * state of a thread that was mid-install in the parent. */
static void lock_before_fork(void) { pthread_mutex_lock(&install_lock); }

static void unlock_in_parent(void) { pthread_mutex_unlock(&install_lock); }

/* ---- fork_generation ---- */

static atomic_ulong fork_generation_value = 0;

static void on_fork_child(void) {
    atomic_fetch_add_explicit(&fork_generation_value, 1, memory_order_relaxed);
    pthread_mutex_unlock(&install_lock);
}

static PyObject *fork_generation(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    return PyLong_FromUnsignedLong(atomic_load_explicit(&fork_generation_value, memory_order_relaxed));
}

/* ---- thread_ids ---- */

static PyObject *thread_ids(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, "/proc/self/task");
    PyObject *result = PyList_New(0);
    if (result == NULL) { closedir(dir); return NULL; }
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        char *end;
        long tid = strtol(entry->d_name, &end, TID_BASE);
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

static PyObject *descriptor_table(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) { return list_descriptors(0); }

/* (fd, st_dev, st_ino, offset) of every descriptor open on a regular file that can seek: what
 * the parent records before each worker fork. In C also so that the GIL is held throughout:
 * os.lseek releases it per file, and another Python thread may then keep it for milliseconds. */
static PyObject *regular_file_offsets(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    return list_descriptors(1);
}

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

/* ---- SIGCONT ----
 * When the process was last continued after a stop (Ctrl-Z, SIGSTOP), on
 * CLOCK_MONOTONIC (Python's time.monotonic). The stall watchdog does not count
 * time spent stopped. Written by a signal handler on any thread: the double's
 * bits in a lock-free atomic (all-zero bits are 0.0, "never continued"). */
static _Atomic unsigned long long last_continued_bits = 0;
/* Written once, under install_lock, before our handler is installed; only read after. */
static struct sigaction previous_cont_action;
static int cont_handler_installed = 0;  /* read and written under install_lock */

static void on_continue(int signum, siginfo_t *info, void *context) {
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) == 0) {
        double seconds = (double)now.tv_sec + (double)now.tv_nsec / NANOSECONDS_PER_SECOND;
        unsigned long long bits;
        memcpy(&bits, &seconds, sizeof(bits));
        atomic_store_explicit(&last_continued_bits, bits, memory_order_relaxed);
    }
    /* Chain to a handler that was there before ours. */
    if (previous_cont_action.sa_flags & SA_SIGINFO) {
        if (previous_cont_action.sa_sigaction != NULL) previous_cont_action.sa_sigaction(signum, info, context);
    } else if (previous_cont_action.sa_handler != SIG_DFL && previous_cont_action.sa_handler != SIG_IGN &&
               previous_cont_action.sa_handler != NULL) {
        previous_cont_action.sa_handler(signum);
    }
}

static PyObject *install_continue_handler(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    int error = 0;
    /* Detached from the interpreter while waiting for the lock and holding it:
     * a blocked thread must not hold up the GIL or a free-threaded stop-the-world. */
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&install_lock);
    if (!cont_handler_installed) {
        /* Record the handler to chain to before ours can run, so the handler
         * never reads previous_cont_action while sigaction() is filling it. */
        struct sigaction action;
        memset(&action, 0, sizeof(action));
        action.sa_sigaction = on_continue;
        action.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGCONT, NULL, &previous_cont_action) != 0 || sigaction(SIGCONT, &action, NULL) != 0)
            error = errno;
        else
            cont_handler_installed = 1;
    }
    pthread_mutex_unlock(&install_lock);
    Py_END_ALLOW_THREADS
    if (error != 0) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_TRUE;
}

static PyObject *last_continued(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    unsigned long long bits = atomic_load_explicit(&last_continued_bits, memory_order_relaxed);
    double seconds;
    memcpy(&seconds, &bits, sizeof(seconds));
    return PyFloat_FromDouble(seconds);
}

/* ---- native backtraces (backtrace.c) ---- */

static PyObject *install_backtrace_handler(PyObject *Py_UNUSED(self), PyObject *args) {
    int signum, fd;
    if (!PyArg_ParseTuple(args, "ii:install_backtrace_handler", &signum, &fd)) return NULL;
    if (sl_install_backtrace_handler(signum, fd) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_TRUE;
}

static PyObject *warm_backtrace(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    sl_warm_backtrace();
    Py_RETURN_NONE;
}

static PyObject *signal_thread(PyObject *Py_UNUSED(self), PyObject *args) {
    int pid, tid, signum;
    if (!PyArg_ParseTuple(args, "iii:signal_thread", &pid, &tid, &signum)) return NULL;
    if (sl_signal_thread(pid, tid, signum) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* ---- the module ----
 * Each docstring starts with its text signature ("name($module, ...)\n--\n\n"),
 * which Python strips from __doc__ and exposes as __text_signature__, so
 * inspect.signature() works on these functions as on the fallback's. */

static PyMethodDef methods[] = {
    {"fork_generation", fork_generation, METH_NOARGS,
     "fork_generation($module, /)\n--\n\n"
     "Number of forks this process descends from since the module was loaded "
     "(counted by a pthread_atfork child handler)."},
    {"thread_ids", thread_ids, METH_NOARGS,
     "thread_ids($module, /)\n--\n\n"
     "Sorted kernel thread ids of every OS thread of this process."},
    {"descriptor_table", descriptor_table, METH_NOARGS,
     "descriptor_table($module, /)\n--\n\n"
     "Every open descriptor of this process as (fd, st_mode, st_dev, st_ino), in listing order."},
    {"regular_file_offsets", regular_file_offsets, METH_NOARGS,
     "regular_file_offsets($module, /)\n--\n\n"
     "(fd, st_dev, st_ino, offset) of every descriptor open on a seekable regular file, in listing order."},
    {"install_continue_handler", install_continue_handler, METH_NOARGS,
     "install_continue_handler($module, /)\n--\n\n"
     "install_continue_handler() -> True: record the time of each SIGCONT (chaining a previous handler)."},
    {"last_continued", last_continued, METH_NOARGS,
     "last_continued($module, /)\n--\n\n"
     "time.monotonic() of the last SIGCONT since install_continue_handler(), 0.0 if none."},
    {"install_backtrace_handler", install_backtrace_handler, METH_VARARGS,
     "install_backtrace_handler($module, signum, fd, /)\n--\n\n"
     "install_backtrace_handler(signum, fd) -> True: on `signum`, the receiving thread "
     "writes its native backtrace (library and symbol of each frame) to `fd`, "
     "from a signal-safe handler."},
    {"warm_backtrace", warm_backtrace, METH_NOARGS,
     "warm_backtrace($module, /)\n--\n\n"
     "Load glibc's unwinder now (backtrace() allocates on its first call), once per process; "
     "forked children inherit it loaded."},
    {"signal_thread", signal_thread, METH_VARARGS,
     "signal_thread($module, pid, tid, signum, /)\n--\n\n"
     "signal_thread(pid, tid, signum): send `signum` to one thread of a process (tgkill)."},
    {NULL, NULL, 0, NULL},
};

/* The fork handlers are process-wide: registered once, not once per module
 * execution (a re-import or another interpreter would count each fork twice). */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_error = 0;  /* pthread_atfork's result, written once inside pthread_once */

static void register_fork_handlers(void) {
    atfork_error = pthread_atfork(lock_before_fork, unlock_in_parent, on_fork_child);
}

static int native_exec(PyObject *Py_UNUSED(module)) {
    pthread_once(&atfork_once, register_fork_handlers);
    if (atfork_error != 0) {
        PyErr_Format(PyExc_OSError, "pthread_atfork failed: %s", strerror(atfork_error));
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
             "forks bypassing os.fork, the kernel ids of every OS thread, the time of the last\n"
             "SIGCONT, and signal-safe native backtraces of a stuck worker's threads.\n"
             "safeloader._native_fallback is the pure-Python stand-in; use safeloader.native.",
    .m_size = 0, /* no per-module state: see the comment at the top of _native.c */
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&module_def); }
