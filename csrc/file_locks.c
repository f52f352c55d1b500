/*
 * Whether an open file description holds an exclusive flock or OFD lock (exclusively_locked; the
 * "files" hook, safeloader/backends/files.py): such a description is a lock, not a data handle,
 * and a worker re-locking a private copy would block on the parent's lock, so it stays shared.
 * A loader's workers read the locks of the files its objects hold (about 2.5 us a file in the
 * kernel: /proc/self/fdinfo/<fd> opened, read and closed), once among them; the parent's lock reader
 * (read_locks_behind) reads them meanwhile on a thread of its own, from the start to its last fork.
 *
 * Why native: a Dataset may hold thousands of files. In Python each read cost as much again in
 * objects (a 64 KiB bytes object, its split lines), and the reader runs without the GIL.
 */
#include "native.h" /* first: Python.h */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* What `text` (an fdinfo entry) says: 1 where it shows a write flock or OFD lock, else 0. */
static int shows_exclusive_lock(const char *text, size_t length) {
    /* Each line: "lock:\t1: FLOCK  ADVISORY  WRITE <pid> <maj:min:inode> 0 EOF". */
    for (size_t start = 0; start < length;) {
        size_t end = start;
        while (end < length && text[end] != '\n') end++;
        const char *fields[5];
        size_t sizes[5];
        int count = 0, write = 0;
        for (size_t at = start; at < end;) {
            while (at < end && (text[at] == ' ' || text[at] == '\t' || text[at] == '\r' || text[at] == '\v' ||
                                text[at] == '\f'))
                at++;
            if (at == end) break;
            size_t from = at;
            while (at < end && !(text[at] == ' ' || text[at] == '\t' || text[at] == '\r' || text[at] == '\v' ||
                                 text[at] == '\f'))
                at++;
            if (count < 5) { fields[count] = text + from; sizes[count] = at - from; }
            if (at - from == 5 && memcmp(text + from, "WRITE", 5) == 0) write = 1;
            count++;
        }
        if (count > 4 && write && sizes[0] == 5 && memcmp(fields[0], "lock:", 5) == 0 &&
            ((sizes[2] == 5 && memcmp(fields[2], "FLOCK", 5) == 0) ||
             (sizes[2] == 6 && memcmp(fields[2], "OFDLCK", 6) == 0)))
            return 1;
        start = end + 1;
    }
    return 0;
}

/* The entry `name` of the fdinfo directory `info` (or the full path, `info` -1): 1 where it shows an
 * exclusive lock, 0 where not or unreadable, -1 where it does not fit `size` bytes and `may_grow` is
 * 0 (a description holding that many locks; the lock reader allocates nothing). */
static int lock_in_entry(int info, const char *name, char *stack, size_t size, int may_grow) {
    int file = openat(info >= 0 ? info : AT_FDCWD, name, O_RDONLY | O_CLOEXEC);
    if (file < 0) return 0;
    char *text = stack;
    size_t length = 0;
    int result = 0;
    for (;;) {  /* a short read is the end: one read unless the description holds many locks */
        if (length == size) {
            if (!may_grow) { result = -1; break; }
            size_t bigger = size * 4;
            char *grown = text == stack ? malloc(bigger) : realloc(text, bigger);
            if (grown == NULL) break;  /* look at what was read */
            if (text == stack) memcpy(grown, stack, length);
            text = grown;
            size = bigger;
        }
        ssize_t count = read(file, text + length, size - length);
        if (count < 0 && errno == EINTR) continue;
        if (count < 0) { length = 0; break; }  /* unreadable: as if unlocked */
        length += (size_t)count;
        if (count == 0 || length < size) break;
    }
    close(file);
    if (result == 0) result = shows_exclusive_lock(text, length);
    if (text != stack) free(text);
    return result;
}

/* Whether `fd`'s open file description holds a write (exclusive) flock or OFD lock: such a
 * description is a lock, not a data handle, and a worker re-locking a private copy would block on
 * the parent's lock. Read from /proc/self/fdinfo/<fd> (`info`: that directory, or -1 and `name`
 * the full path), never from
 * /proc/locks: reading that takes the kernel's global file-lock semaphore for writing, which
 * waits for an RCU grace period (milliseconds, tens of them on a busy machine) and stalls every
 * lock call on the system. POSIX (fcntl) locks belong to the process, not to the description: a
 * worker holds none of them, and is not skipped. Unreadable: 0, as if unlocked. */
int sl_holds_exclusive_lock(int info, const char *name) {
    char stack[4096];
    return lock_in_entry(info, name, stack, sizeof stack, 1);
}

/* exclusively_locked(fds) -> tuple: the descriptors of `fds` (a tuple) whose open file description
 * holds an exclusive flock or OFD lock (holds_exclusive_lock), in the order given. The parent's,
 * once per start (safeloader/backends/files.py): its workers then need not read them each. */
PyObject *sl_exclusively_locked(PyObject *Py_UNUSED(self), PyObject *fds) {
    if (!PyTuple_Check(fds)) return PyErr_Format(PyExc_TypeError, "fds must be a tuple, got %.80s", Py_TYPE(fds)->tp_name);
    PyObject *found = PyList_New(0);
    if (found == NULL) return NULL;
    int info_dir = PyTuple_GET_SIZE(fds) ? open("/proc/self/fdinfo", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fds); i++) {
        PyObject *item = PyTuple_GET_ITEM(fds, i);
        long fd = PyLong_AsLong(item);
        if (fd == -1 && PyErr_Occurred()) goto error;
        if (fd < 0 || fd > INT32_MAX) continue;
        char info[40];
        snprintf(info, sizeof info, "/proc/self/fdinfo/%ld", fd);
        if (sl_holds_exclusive_lock(info_dir, info_dir >= 0 ? strrchr(info, '/') + 1 : info) &&
            PyList_Append(found, item) < 0)
            goto error;
    }
    if (info_dir >= 0) close(info_dir);
    PyObject *result = PyList_AsTuple(found);
    Py_DECREF(found);
    return result;
error:
    if (info_dir >= 0) close(info_dir);
    Py_DECREF(found);
    return NULL;
}

/* The lock reader: a thread of the parent that reads the locks of a start's held files into the
 * start's lock_states (privatize_files') while the parent forks its workers, which then find them
 * read. Its descriptors are in a table of its own (close_range CLOSE_RANGE_UNSHARE, Linux 5.9+), so
 * that a worker forked meanwhile inherits none of them; it reads the process's table through
 * /proc/self/fdinfo. All signals blocked (a handler run on it could not reach the process's
 * descriptors, Python's wakeup fd among them), nothing allocated, no Python. thread_ids() leaves it
 * out (own_thread): it is safeloader's, not a library's pool. */
#define LOCK_FREE 1
#define LOCK_HELD 2
#define MAX_READERS 8

static pid_t reader_tids[MAX_READERS]; /* the readers running now (-1: starting), 0: a free slot */
static pid_t reader_pid;                /* the process they run in: a forked child has none */

int sl_own_thread(long tid) {
    if (tid <= 0 || __atomic_load_n(&reader_pid, __ATOMIC_ACQUIRE) != getpid()) return 0;
    for (int i = 0; i < MAX_READERS; i++)
        if (__atomic_load_n(&reader_tids[i], __ATOMIC_ACQUIRE) == tid) return 1;
    return 0;
}

typedef struct {
    pthread_t thread;
    pid_t pid;            /* the process that started it: joined only there */
    int slot;             /* its reader_tids slot */
    int stop;             /* set by stop_reader: the thread ends before its next file */
    int *fds;
    size_t count;
    unsigned char *states;
    Py_buffer states_buffer;  /* held until the thread is joined */
    Py_buffer records_buffer; /* the records, their identities written in first */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int identified;           /* under `lock`: the identities are written (or the thread ended) */
} lock_reader;

/* A record is private_files.c's sl_file_record: 32 bytes, the descriptor an int64_t, then st_dev and
 * st_ino as uint64_t (both 0: not recorded), then the offset. */
#define RECORD_SIZE 32

static void set_identified(lock_reader *reader) {
    pthread_mutex_lock(&reader->lock);
    reader->identified = 1;
    pthread_cond_broadcast(&reader->changed);
    pthread_mutex_unlock(&reader->lock);
}

static void *read_locks(void *arg) {
    lock_reader *reader = arg;
    __atomic_store_n(&reader_tids[reader->slot], (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    prctl(PR_SET_NAME, "sl-lock-reader", 0, 0, 0);  /* for people reading top -H or a stack dump */
    /* First, in the process's own table, what each descriptor names (an fstat each, no descriptor
     * made): the parent waits for these before its first fork reads the offsets, so that a worker
     * can tell a descriptor swapped for another file since (the offset read is then not its own). */
    unsigned char *records = reader->records_buffer.buf;
    for (size_t i = 0; i < reader->count && !__atomic_load_n(&reader->stop, __ATOMIC_RELAXED); i++) {
        struct stat st;
        if (reader->fds[i] < 0 || fstat(reader->fds[i], &st) != 0) continue;  /* closed: 0/0, looked at by the worker */
        uint64_t dev = (uint64_t)st.st_dev, ino = (uint64_t)st.st_ino;
        memcpy(records + RECORD_SIZE * i + 8, &dev, sizeof dev);
        memcpy(records + RECORD_SIZE * i + 16, &ino, sizeof ino);
    }
    set_identified(reader);
#ifdef SYS_close_range
    int own_table = syscall(SYS_close_range, 0U, ~0U, 2U /* CLOSE_RANGE_UNSHARE */) == 0;
#else
    int own_table = 0;
#endif
    if (own_table) {  /* else nothing is read: the workers read every lock themselves */
        /* "self" names the thread group, whose leader's table is the process's (not this thread's
         * own): the same directory as /proc/<pid>, but never another namespace's process. */
        int info = open("/proc/self/fdinfo", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        char text[4096], name[24];
        for (size_t i = reader->count; info >= 0 && i-- > 0;) {  /* from the end: the first worker begins at 0 */
            if (__atomic_load_n(&reader->stop, __ATOMIC_RELAXED)) break;
            if (__atomic_load_n(&reader->states[i], __ATOMIC_RELAXED)) continue;
            snprintf(name, sizeof name, "%d", reader->fds[i]);
            int found = lock_in_entry(info, name, text, sizeof text, 0);
            if (found >= 0) __atomic_store_n(&reader->states[i], found ? LOCK_HELD : LOCK_FREE, __ATOMIC_RELAXED);
        }
        if (info >= 0) close(info);
    }
    __atomic_store_n(&reader_tids[reader->slot], 0, __ATOMIC_RELEASE);
    return NULL;
}

/* Stop the thread (it ends before its next file, within microseconds) and join it: no Python. */
static void join_reader(lock_reader *reader) {
    if (reader->pid == getpid()) {  /* in a forked child the thread does not exist */
        __atomic_store_n(&reader->stop, 1, __ATOMIC_RELAXED);
        pthread_join(reader->thread, NULL);
    }
}

/* With the GIL, once joined. */
static void free_reader(lock_reader *reader) {
    if (reader->pid == getpid()) {
        pthread_mutex_destroy(&reader->lock);
        pthread_cond_destroy(&reader->changed);
    }
    PyBuffer_Release(&reader->records_buffer);
    PyBuffer_Release(&reader->states_buffer);
    free(reader->fds);
    free(reader);
}

static const char READER[] = "safeloader.lock_reader", STOPPED[] = "safeloader.lock_reader.stopped";

static void reader_capsule_destructor(PyObject *capsule) {
    lock_reader *reader = PyCapsule_GetPointer(capsule, READER);
    if (reader == NULL) { PyErr_Clear(); return; }
    join_reader(reader);
    free_reader(reader);
}

/* read_locks_behind(records, lock_states) -> capsule or None: start the lock reader on the
 * descriptors of `records` (file_records' bytes) into `lock_states` (a writable buffer, one byte a
 * record, shared with the workers: 0 not read, else LOCK_FREE or LOCK_HELD; privatize_files reads
 * the same); None where no reader slot is free or no thread could start. The thread is stopped and
 * joined when the capsule goes (stop_lock_reader does it now): it is there to be done before the
 * start's last fork, not to outlive it. */
PyObject *sl_read_locks_behind(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *records_object, *states_object;
    if (!PyArg_ParseTuple(args, "OO:read_locks_behind", &records_object, &states_object)) return NULL;
    lock_reader *reader = calloc(1, sizeof *reader);
    if (reader == NULL) return PyErr_NoMemory();
    if (PyObject_GetBuffer(records_object, &reader->records_buffer, PyBUF_WRITABLE) < 0) { free(reader); return NULL; }
    size_t count = (size_t)reader->records_buffer.len / RECORD_SIZE;
    if (reader->records_buffer.len % RECORD_SIZE != 0) {
        PyErr_SetString(PyExc_ValueError, "records must be file_records' bytes");
        goto fail;
    }
    if ((reader->fds = malloc((count + 1) * sizeof *reader->fds)) == NULL) { PyErr_NoMemory(); goto fail; }
    for (size_t i = 0; i < count; i++) {
        int64_t fd;
        memcpy(&fd, (const char *)reader->records_buffer.buf + RECORD_SIZE * i, sizeof fd);
        reader->fds[i] = fd < 0 || fd > INT32_MAX ? -1 : (int)fd;
    }
    if (PyObject_GetBuffer(states_object, &reader->states_buffer, PyBUF_WRITABLE) < 0) goto fail;
    if ((size_t)reader->states_buffer.len != count) {
        PyErr_Format(PyExc_ValueError, "lock_states must hold one byte a record (%zu), got %zd", count,
                     reader->states_buffer.len);
        goto fail;
    }
    reader->states = reader->states_buffer.buf;
    reader->count = count;
    reader->pid = getpid();
    __atomic_store_n(&reader_pid, reader->pid, __ATOMIC_RELEASE);
    pthread_mutex_init(&reader->lock, NULL);
    pthread_cond_init(&reader->changed, NULL);
    reader->slot = -1;
    for (int i = 0; i < MAX_READERS && reader->slot < 0; i++) {
        pid_t none = 0;
        if (__atomic_compare_exchange_n(&reader_tids[i], &none, (pid_t)-1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            reader->slot = i;  /* -1 until the thread stores its id */
    }
    pthread_attr_t attr;
    sigset_t all, old;
    int started = -1;
    if (reader->slot >= 0 && pthread_attr_init(&attr) == 0) {
        pthread_attr_setstacksize(&attr, 64 * 1024);
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        started = pthread_create(&reader->thread, &attr, read_locks, reader);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
    }
    if (started != 0) {
        if (reader->slot >= 0) __atomic_store_n(&reader_tids[reader->slot], 0, __ATOMIC_RELEASE);
        free_reader(reader);
        Py_RETURN_NONE;
    }
    /* Its id published before this returns: a census taken next leaves it out. */
    while (__atomic_load_n(&reader_tids[reader->slot], __ATOMIC_ACQUIRE) == (pid_t)-1) sched_yield();
    PyObject *capsule = PyCapsule_New(reader, READER, reader_capsule_destructor);
    if (capsule == NULL) {
        join_reader(reader);
        free_reader(reader);
    }
    return capsule;
fail:
    PyBuffer_Release(&reader->records_buffer);
    PyBuffer_Release(&reader->states_buffer);
    free(reader->fds);
    free(reader);
    return NULL;
}

/* lock_reader_identified(reader): wait until the reader has written each record's identity (an
 * fstat each, before its locks), or has ended. The parent's, before the offsets of its first fork. */
PyObject *sl_lock_reader_identified(PyObject *Py_UNUSED(self), PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, STOPPED)) Py_RETURN_NONE;
    lock_reader *reader = PyCapsule_GetPointer(capsule, READER);
    if (reader == NULL) return NULL;
    if (reader->pid != getpid()) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&reader->lock);
    while (!reader->identified) pthread_cond_wait(&reader->changed, &reader->lock);
    pthread_mutex_unlock(&reader->lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* stop_lock_reader(capsule): stop the reader now (it ends before its next file) and join it; then
 * the capsule holds nothing (a second call does nothing). */
PyObject *sl_stop_lock_reader(PyObject *Py_UNUSED(self), PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, STOPPED)) Py_RETURN_NONE;
    lock_reader *reader = PyCapsule_GetPointer(capsule, READER);
    if (reader == NULL) return NULL;
    if (PyCapsule_SetDestructor(capsule, NULL) < 0 || PyCapsule_SetName(capsule, STOPPED) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    join_reader(reader);
    Py_END_ALLOW_THREADS
    free_reader(reader);
    Py_RETURN_NONE;
}
