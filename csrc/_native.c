/*
 * safeloader._native: what Python cannot see cheaply about fork and threads.
 *
 * - fork_generation(): a counter bumped by a pthread_atfork child handler, so
 *   it counts every fork of this process, also forks that bypass os.fork
 *   (a C library calling fork() directly), which os.register_at_fork misses.
 * - thread_ids(): the kernel thread ids of every OS thread of this process,
 *   read from /proc/self/task, including threads Python did not start
 *   (Rust/rayon, OpenMP, OpenBLAS, gloo...); threads_within() checks them against
 *   an earlier list without allocating (between a loader start's forks).
 * - install_backtrace_handler() / release_backtrace_handler() / warm_backtrace() /
 *   signal_thread(): signal-safe native backtraces of a stuck worker's threads,
 *   for the stall watchdog (backtrace.c), on a signal nobody else holds:
 *   signal_handler_address() tells whether one is free (a handler installed
 *   in C, e.g. by faulthandler, is invisible to signal.getsignal); free_signals()
 *   finds such signals in one call.
 * - parse_maps(): /proc/self/maps as lists of bounds and paths (thread attribution, where
 *   the kernel cannot say which mapping holds a stack: PROCMAP_QUERY).
 * - code_segments(): the loaded objects' executable segments (thread attribution).
 * - reserve_descriptor_slots(): grow the descriptor table ahead of need (safeloader/_fd_table.py).
 * - descriptor_kinds(): whether a read-only file or a TCP socket is open, allocating nothing
 *   (between a loader start's forks).
 * - exit_handler_lock(): glibc's exit-handler lock, which the child handler releases when a
 *   thread of the parent held it at the fork (exit_lock.c).
 * - loaded_objects(): the dynamic loader's list of loaded objects, walked in C
 *   (no Python callback while the loader's lock is held), with the GIL released
 *   or held as safeloader/_loader_lock.py decides.
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
 *   objects a signal handler may access, C11 7.14.1.1), asserted below:
 *   fork_generation_value and backtrace.c's output_fd.
 * - No lock is taken around fork(): only a pthread_atfork child handler is
 *   registered, so a fork never waits for this module, nor this module for a
 *   fork of another thread.
 * - The pthread_atfork handler is registered once per process (pthread_once),
 *   so re-executing the module (a re-import, another interpreter) does not
 *   count each fork twice.
 * - fork_generation_value is written only in a fork child, by its only thread,
 *   before fork() returns there; nothing else writes it.
 * - install_backtrace_handler from two threads at once: each call stores its
 *   fd atomically and installs the same handler, so one of the two fds wins,
 *   as it would with the calls in either order under the GIL.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <fcntl.h>
#include <link.h>
#include <stddef.h>
#include <errno.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backtrace.h"
#include "exit_lock.h"
#include "fast_fork.h"

/* Lock-free atomics are the only shared objects a signal handler may use
 * (C11 7.14.1.1); a lock-based fallback could deadlock inside the handler. */
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2, "fork_generation_value must be a lock-free atomic");
/* Thread ids in /proc/self/task are decimal numbers. */
#define TID_BASE 10

/* ---- fork_generation ---- */

static atomic_ulong fork_generation_value = 0;

static void on_fork_child(void) {
    sl_exit_lock_on_child(); /* first: another child handler may register an exit handler */
    atomic_fetch_add_explicit(&fork_generation_value, 1, memory_order_relaxed);
    sl_fast_fork_on_child();
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

/* The numbered entries of a /proc directory (/proc/self/task, /proc/self/fd), each given to
 * `visit(number, own, data)` (`own`: the listing's own descriptor) until it returns 0 (stop) or -1
 * (a Python error set). For the parent between a loader start's worker forks, where every object
 * allocated or freed writes a page the workers forked so far share (a copy-on-write fault each):
 * nothing is allocated here, Python's or malloc's (getdents64 into a buffer on the stack, not
 * opendir). Returns 0, or -1 with a Python error set. */
struct proc_dirent64 {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static int each_proc_entry(const char *path, int (*visit)(long, int, void *), void *data) {
    int own = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (own < 0) { PyErr_SetFromErrnoWithFilename(PyExc_OSError, path); return -1; }
    _Alignas(8) char buffer[4096];
    for (;;) {
        long count = syscall(SYS_getdents64, own, buffer, sizeof buffer);
        if (count < 0) {
            int error = errno;
            close(own);
            errno = error;
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
            return -1;
        }
        if (count == 0) break;
        for (long position = 0; position < count;) {
            struct proc_dirent64 *entry = (struct proc_dirent64 *)(buffer + position);
            position += entry->d_reclen;
            char *end;
            long number = strtol(entry->d_name, &end, 10);
            if (entry->d_name[0] == '\0' || *end != '\0') continue;  /* "." and ".." */
            int more = visit(number, own, data);
            if (more <= 0) { close(own); return more; }
        }
    }
    close(own);
    return 0;
}

/* threads_within(known) -> bool: whether every thread of this process now is in `known`, a sorted
 * tuple of thread ids (thread_ids() of an earlier call; threads that ended since do not count).
 * Allocates nothing (each_proc_entry), and `known` is only read. */
struct within {
    PyObject *known;
    int within;
};

static int tid_known(long tid, int Py_UNUSED(own), void *data) {
    struct within *check = data;
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
    if (each_proc_entry("/proc/self/task", tid_known, &check) < 0) return -1;
    return check.within;
}

static PyObject *threads_within(PyObject *Py_UNUSED(self), PyObject *known) {
    if (!PyTuple_Check(known)) {
        PyErr_Format(PyExc_TypeError, "threads_within: known must be a tuple, got %.100s", Py_TYPE(known)->tp_name);
        return NULL;
    }
    int within = sl_threads_within(known);
    return within < 0 ? NULL : PyBool_FromLong(within);
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

/* What kinds of descriptor this process holds, as a bitmask: 1, a regular file open read-only;
 * 2, a regular file (any access mode); 4, an IPv4/IPv6 stream socket (TCP, connected or not).
 * The parent asks before each worker fork whether the fork hooks that privatize files and sever
 * connections have anything to do there; when they do not, their worker runs none of their code.
 * Allocates nothing (each_proc_entry). */
static int add_kind(long fd, int own, void *data) {
    long *kinds = data;
    struct stat st;
    if (fd == own || fstat((int)fd, &st) != 0) return 1;  /* the listing's own, or closed meanwhile */
    if (S_ISREG(st.st_mode)) {
        *kinds |= 2;
        int flags = fcntl((int)fd, F_GETFL);
        if (flags >= 0 && (flags & O_ACCMODE) == O_RDONLY && !(flags & O_PATH)) *kinds |= 1;
    } else if (S_ISSOCK(st.st_mode)) {
        int domain = 0, type = 0;
        socklen_t size = sizeof domain;
        if (getsockopt((int)fd, SOL_SOCKET, SO_DOMAIN, &domain, &size) != 0) return 1;
        size = sizeof type;
        if (getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &size) != 0) return 1;
        if ((domain == AF_INET || domain == AF_INET6) && type == SOCK_STREAM) *kinds |= 4;
    }
    return 1;
}

long sl_descriptor_kinds(void) {
    long kinds = 0;
    return each_proc_entry("/proc/self/fd", add_kind, &kinds) < 0 ? -1 : kinds;
}

static PyObject *descriptor_kinds(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    long kinds = sl_descriptor_kinds();
    return kinds < 0 ? NULL : PyLong_FromLong(kinds);
}

/* Make room in this process's descriptor table for `spare` descriptors above the lowest free
 * number (fewer where the RLIMIT_NOFILE soft limit is lower). A descriptor duplicated at that
 * number makes the kernel grow the table, which never shrinks, and is closed at once; F_DUPFD
 * takes the lowest free number at or above the one asked, so no open descriptor is touched.
 * Returns the table's slots asked of the kernel, 0 where nothing was done (no open descriptor
 * to duplicate, the limit reached). */
static PyObject *reserve_descriptor_slots(PyObject *Py_UNUSED(self), PyObject *arg) {
    long spare = PyLong_AsLong(arg);
    if (spare == -1 && PyErr_Occurred()) return NULL;
    for (int fd = 0; fd < 1024; fd++) {  /* the first open descriptor: 0 in nearly every process */
        int lowest = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (lowest < 0) {
            if (errno == EBADF) continue;
            break;  /* EMFILE: no room at all */
        }
        close(lowest);
        long slots = lowest + (spare > 0 ? spare : 0);
        struct rlimit limit;
        if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY && (rlim_t)slots > limit.rlim_cur)
            slots = (long)limit.rlim_cur;
        if (slots <= lowest + 1 || slots > INT_MAX) break;  /* nothing to grow */
        int high = fcntl(fd, F_DUPFD_CLOEXEC, (int)(slots - 1));
        if (high < 0) break;  /* EINVAL or EMFILE: the table stays as it is */
        close(high);
        return PyLong_FromLong(slots);
    }
    return PyLong_FromLong(0);
}

/* ---- signal dispositions ---- */

/* The current handler of `signum` as an address: 0 for SIG_DFL, 1 for SIG_IGN.
 * sigaction sees what signal.getsignal cannot: a handler installed in C
 * (faulthandler.register, a native library, a profiler). */
static PyObject *signal_handler_address(PyObject *Py_UNUSED(self), PyObject *args) {
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
static PyObject *free_signals(PyObject *Py_UNUSED(self), PyObject *arg) {
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

/* ---- loaded objects ---- */

typedef struct {
    char **names;
    size_t count, capacity;
    unsigned long long adds, subs;
    int counters, full, failed;
} objects_t;

static int collect_object(struct dl_phdr_info *info, size_t size, void *data) {
    objects_t *objects = data;
    if (objects->count == 0 && !objects->counters) {
        objects->counters = size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs);
        if (objects->counters) { objects->adds = info->dlpi_adds; objects->subs = info->dlpi_subs; }
    }
    if (!objects->full) return 1; /* the counters are all that was asked */
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0') return 0;
    if (objects->count == objects->capacity) {
        size_t capacity = objects->capacity ? 2 * objects->capacity : 64;
        char **names = realloc(objects->names, capacity * sizeof(char *));
        if (names == NULL) { objects->failed = 1; return 1; }
        objects->names = names;
        objects->capacity = capacity;
    }
    char *name = strdup(info->dlpi_name);
    if (name == NULL) { objects->failed = 1; return 1; }
    objects->names[objects->count++] = name;
    return 0;
}

/* The dynamic loader's (loads, unloads) counters now, allocating nothing: 1, or 0 where this
 * glibc has none. Takes the loader's lock (the caller decides when that is safe). */
int sl_loaded_counters(unsigned long long *adds, unsigned long long *subs) {
    objects_t objects = {.names = NULL, .count = 0, .capacity = 0, .counters = 0, .full = 0, .failed = 0};
    dl_iterate_phdr(collect_object, &objects);
    *adds = objects.adds;
    *subs = objects.subs;
    return objects.counters;
}

/* loaded_objects(full, release_gil) -> ((adds, subs) or None, names or None). The walk
 * holds the dynamic loader's lock and runs C only; the Python objects are built after it.
 * With release_gil false the GIL stays held throughout, so no other Python thread can
 * fork meanwhile (safeloader/_loader_lock.py says when each is used). */
static PyObject *loaded_objects(PyObject *Py_UNUSED(self), PyObject *args) {
    int full, release_gil;
    if (!PyArg_ParseTuple(args, "pp:loaded_objects", &full, &release_gil)) return NULL;
    objects_t objects = {.names = NULL, .count = 0, .capacity = 0, .counters = 0, .full = full, .failed = 0};
    if (release_gil) {
        Py_BEGIN_ALLOW_THREADS
        dl_iterate_phdr(collect_object, &objects);
        Py_END_ALLOW_THREADS
    } else {
        dl_iterate_phdr(collect_object, &objects);
    }
    PyObject *result = NULL, *names = NULL, *counters = NULL;
    if (objects.failed) { PyErr_NoMemory(); goto done; }
    if (objects.counters) counters = Py_BuildValue("(KK)", objects.adds, objects.subs);
    else { counters = Py_None; Py_INCREF(counters); }
    if (counters == NULL) goto done;
    if (full) {
        names = PyTuple_New((Py_ssize_t)objects.count);
        if (names == NULL) goto done;
        for (size_t i = 0; i < objects.count; i++) {
            PyObject *name = PyUnicode_DecodeFSDefault(objects.names[i]);
            if (name == NULL) goto done;
            PyTuple_SET_ITEM(names, (Py_ssize_t)i, name);
        }
    } else {
        names = Py_None;
        Py_INCREF(names);
    }
    result = PyTuple_Pack(2, counters, names);
done:
    Py_XDECREF(counters);
    Py_XDECREF(names);
    for (size_t i = 0; i < objects.count; i++) free(objects.names[i]);
    free(objects.names);
    return result;
}

/* ---- the loaded objects' code ---- */

typedef struct {
    unsigned long long *bounds; /* start, end pairs */
    char **names;
    size_t count, capacity;
    int failed;
} segments_t;

static int collect_segments(struct dl_phdr_info *info, size_t Py_UNUSED(size), void *data) {
    segments_t *segments = data;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[i];
        if (header->p_type != PT_LOAD || !(header->p_flags & PF_X) || header->p_memsz == 0) continue;
        if (segments->count == segments->capacity) {
            size_t capacity = segments->capacity ? 2 * segments->capacity : 256;
            unsigned long long *bounds = realloc(segments->bounds, 2 * capacity * sizeof(unsigned long long));
            if (bounds == NULL) { segments->failed = 1; return 1; }
            segments->bounds = bounds;
            char **names = realloc(segments->names, capacity * sizeof(char *));
            if (names == NULL) { segments->failed = 1; return 1; }
            segments->names = names;
            segments->capacity = capacity;
        }
        char *copy = strdup(name);
        if (copy == NULL) { segments->failed = 1; return 1; }
        unsigned long long start = (unsigned long long)(info->dlpi_addr + header->p_vaddr);
        segments->bounds[2 * segments->count] = start;
        segments->bounds[2 * segments->count + 1] = start + header->p_memsz;
        segments->names[segments->count++] = copy;
    }
    return 0;
}

/* code_segments(release_gil) -> ((start, end, name), ...): each loaded object's executable
 * segments as the dynamic loader has them (name "" for the main program), in load order:
 * what /proc/self/maps says of the loaded code, without the kernel writing out every
 * mapping (2-3 ms in a process with 300 libraries; this walk takes about 0.1 ms).
 * The walk holds the loader's lock, as loaded_objects' does. */
static PyObject *code_segments(PyObject *Py_UNUSED(self), PyObject *args) {
    int release_gil;
    if (!PyArg_ParseTuple(args, "p:code_segments", &release_gil)) return NULL;
    segments_t segments = {.bounds = NULL, .names = NULL, .count = 0, .capacity = 0, .failed = 0};
    if (release_gil) {
        Py_BEGIN_ALLOW_THREADS
        dl_iterate_phdr(collect_segments, &segments);
        Py_END_ALLOW_THREADS
    } else {
        dl_iterate_phdr(collect_segments, &segments);
    }
    PyObject *result = NULL;
    if (segments.failed) { PyErr_NoMemory(); goto done; }
    result = PyTuple_New((Py_ssize_t)segments.count);
    if (result == NULL) goto done;
    for (size_t i = 0; i < segments.count; i++) {
        PyObject *item = Py_BuildValue("(KKO&)", segments.bounds[2 * i], segments.bounds[2 * i + 1],
                                       PyUnicode_DecodeFSDefault, segments.names[i]);
        if (item == NULL) { Py_CLEAR(result); goto done; }
        PyTuple_SET_ITEM(result, (Py_ssize_t)i, item);
    }
done:
    for (size_t i = 0; i < segments.count; i++) free(segments.names[i]);
    free(segments.names);
    free(segments.bounds);
    return result;
}

/* ---- native backtraces (backtrace.c) ---- */

static PyObject *install_backtrace_handler(PyObject *Py_UNUSED(self), PyObject *args) {
    int signum, fd;
    if (!PyArg_ParseTuple(args, "ii:install_backtrace_handler", &signum, &fd)) return NULL;
    if (sl_install_backtrace_handler(signum, fd) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_TRUE;
}

static PyObject *release_backtrace_handler(PyObject *Py_UNUSED(self), PyObject *args) {
    int signum;
    if (!PyArg_ParseTuple(args, "i:release_backtrace_handler", &signum)) return NULL;
    int released = sl_release_backtrace_handler(signum);
    if (released < 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyBool_FromLong(released);
}

static PyObject *warm_backtrace(PyObject *Py_UNUSED(self), PyObject *args) {
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

/* ---- /proc/self/maps, parsed ---- */

/* A hexadecimal number at *p, before lim; moves *p past it. 0 if there is none. */
static int parse_hex(const char **p, const char *lim, unsigned long long *value) {
    const char *q = *p;
    unsigned long long v = 0;
    while (q < lim) {
        char c = *q;
        int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0) break;
        v = (v << 4) | (unsigned long long)digit;
        q++;
    }
    if (q == *p) return 0;
    *p = q;
    *value = v;
    return 1;
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

/* parse_maps(data) -> (all_starts, all_ends, starts, ends, names): the text of /proc/self/maps
 * ("low-high perms offset dev inode path" a line, sorted by address) as lists: every mapping's
 * bounds, then the bounds and path of each executable mapping of a file. The Python loop doing
 * this took 2 ms for the 1700 mappings of a process with 300 shared objects. */
static PyObject *parse_maps(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *lists[5] = {NULL, NULL, NULL, NULL, NULL}, *result = NULL;
    for (int i = 0; i < 5; i++) {
        lists[i] = PyList_New(0);
        if (lists[i] == NULL) goto done;
    }
    const char *p = view.buf, *end = p + view.len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL) eol = end;
        const char *q = p;
        unsigned long long low, high;
        if (parse_hex(&q, eol, &low) && q < eol && *q == '-' && (q++, parse_hex(&q, eol, &high))) {
            if (append_new(lists[0], PyLong_FromUnsignedLongLong(low)) < 0) goto done;
            if (append_new(lists[1], PyLong_FromUnsignedLongLong(high)) < 0) goto done;
            /* q is at the space before the permissions ("r-xp"): the third is 'x'. */
            const char *path = q + 4 <= eol && q[3] == 'x' ? memchr(q, '/', (size_t)(eol - q)) : NULL;
            if (path != NULL) {
                if (append_new(lists[2], PyLong_FromUnsignedLongLong(low)) < 0) goto done;
                if (append_new(lists[3], PyLong_FromUnsignedLongLong(high)) < 0) goto done;
                if (append_new(lists[4], PyUnicode_DecodeFSDefaultAndSize(path, eol - path)) < 0) goto done;
            }
        }
        p = eol + 1;
    }
    result = PyTuple_Pack(5, lists[0], lists[1], lists[2], lists[3], lists[4]);
done:
    for (int i = 0; i < 5; i++) Py_XDECREF(lists[i]);
    PyBuffer_Release(&view);
    return result;
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
    {"threads_within", threads_within, METH_O,
     "threads_within($module, known, /)\n--\n\n"
     "Whether every thread of this process now is in `known`, a sorted tuple of thread ids "
     "(threads that ended since do not count); allocates nothing."},
    {"descriptor_table", descriptor_table, METH_NOARGS,
     "descriptor_table($module, /)\n--\n\n"
     "Every open descriptor of this process as (fd, st_mode, st_dev, st_ino), in listing order."},
    {"regular_file_offsets", regular_file_offsets, METH_NOARGS,
     "regular_file_offsets($module, /)\n--\n\n"
     "(fd, st_dev, st_ino, offset) of every descriptor open on a seekable regular file, in listing order."},
    {"free_signals", free_signals, METH_O,
     "free_signals($module, count, /)\n--\n\n"
     "Up to `count` real-time signals whose disposition is SIG_DFL, from SIGRTMAX down."},
    {"descriptor_kinds", descriptor_kinds, METH_NOARGS,
     "descriptor_kinds($module, /)\n--\n\n"
     "What kinds of descriptor this process holds, a bitmask: 1 a regular file open read-only, "
     "2 a regular file, 4 an IPv4/IPv6 stream socket."},
    {"reserve_descriptor_slots", reserve_descriptor_slots, METH_O,
     "reserve_descriptor_slots($module, spare, /)\n--\n\n"
     "Grow this process's descriptor table to hold `spare` descriptors above the lowest free number "
     "(capped by the RLIMIT_NOFILE soft limit); the slots asked of the kernel, or 0 where nothing was done."},
    {"signal_handler_address", signal_handler_address, METH_VARARGS,
     "signal_handler_address($module, signum, /)\n--\n\n"
     "The address of the current handler of `signum` as sigaction() gives it (also one installed "
     "in C, which signal.getsignal does not see): 0 for SIG_DFL, 1 for SIG_IGN."},
    {"exit_handler_lock", sl_exit_handler_lock, METH_NOARGS,
     "exit_handler_lock($module, /)\n--\n\n"
     "(address, held_at_fork): where glibc's exit-handler lock is (0: not found), which each fork "
     "child's handler releases if a thread of the parent held it, and whether it was held when "
     "this process was forked."},
    {"loaded_objects", loaded_objects, METH_VARARGS,
     "loaded_objects($module, full, release_gil, /)\n--\n\n"
     "((adds, subs) or None, names or None): the dynamic loader's load and unload counters and, "
     "with `full`, the names of the loaded objects in load order; the GIL is released during "
     "the walk only with `release_gil`."},
    {"install_backtrace_handler", install_backtrace_handler, METH_VARARGS,
     "install_backtrace_handler($module, signum, fd, /)\n--\n\n"
     "install_backtrace_handler(signum, fd) -> True: on `signum`, the receiving thread "
     "writes its native backtrace (library and symbol of each frame) to `fd`, "
     "from a signal-safe handler."},
    {"release_backtrace_handler", release_backtrace_handler, METH_VARARGS,
     "release_backtrace_handler($module, signum, /)\n--\n\n"
     "release_backtrace_handler(signum) -> bool: put SIG_DFL back on `signum` if the backtrace "
     "handler is still the one there (a handler installed since is left alone)."},
    {"warm_backtrace", warm_backtrace, METH_VARARGS,
     "warm_backtrace($module, release_gil, /)\n--\n\n"
     "Load glibc's unwinder now (backtrace() allocates on its first call), once per process; "
     "forked children inherit it loaded. It dlopens: the GIL is released meanwhile only with "
     "`release_gil` (safeloader/_loader_lock.py)."},
    {"code_segments", code_segments, METH_VARARGS,
     "code_segments($module, release_gil, /)\n--\n\n"
     "((start, end, name), ...): the loaded objects' executable segments, in load order."},
    {"parse_maps", parse_maps, METH_O,
     "parse_maps($module, data, /)\n--\n\n"
     "(all_starts, all_ends, starts, ends, names) from the bytes of /proc/self/maps: every "
     "mapping's bounds, then the bounds and path of each executable mapping of a file."},
    {"signal_thread", signal_thread, METH_VARARGS,
     "signal_thread($module, pid, tid, signum, /)\n--\n\n"
     "signal_thread(pid, tid, signum): send `signum` to one thread of a process (tgkill)."},
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

/* The fork handler is process-wide: registered once, not once per module
 * execution (a re-import or another interpreter would count each fork twice). */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_error = 0;  /* pthread_atfork's result, written once inside pthread_once */

static void register_fork_handlers(void) {
    sl_exit_lock_find();
    atfork_error = pthread_atfork(NULL, NULL, on_fork_child);
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
             "forks bypassing os.fork, the kernel ids of every OS thread, signal dispositions, the\n"
             "loaded objects, and signal-safe native backtraces of a stuck worker's threads.\n"
             "safeloader._native_fallback is the pure-Python stand-in; use safeloader.native.",
    .m_size = 0, /* no per-module state: see the comment at the top of _native.c */
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&module_def); }
