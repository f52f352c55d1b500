/*
 * The "files" hook's work on descriptors (safeloader/backends/files.py, _reopen.py): what the parent
 * records of the regular files a worker inherits (file_records; for a loader's held files once per
 * start, and file_offsets at each fork), and the worker's own open file description of each one
 * open read-only, installed under the same number (privatize_files).
 *
 * Why native: a Dataset may hold thousands of files (shards opened in __init__). In Python each
 * one cost the parent about 4 us per fork (an fstat, fcntl and lseek, and their objects) and each
 * worker about 40 us, half of it Python (a stat_result, a dataclass, the fdinfo text read into a
 * 64 KiB bytes object and split, the os.open path string...), every object made writing pages the
 * worker shares with its parent (a copy-on-write fault each): 4,000 files took about 160 ms of CPU
 * per worker. Here a worker makes no Python object per file, and the parent hands it one bytes
 * object. What is left is the kernel's: each worker's reopen (by path where the parent knows it,
 * about 3 us a file, else through /proc/self/fd), reading each description's locks from
 * /proc/self/fdinfo (file_locks.c, about 2-3 us a file: for the files a loader's objects hold,
 * once per start, shared among its workers through lock_states; with check_locks, where every
 * read-only file is privatized, by each worker), and one lseek a file at each fork in the parent.
 *
 * A record is `sl_file_record`, packed in a bytes object (the Python side reads it with the
 * struct format "=qQQq", _reopen.RECORD): the descriptor, its file's st_dev and st_ino, and its
 * offset (-1: cannot seek).
 */
#include "native.h" /* first: Python.h */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    int64_t fd;
    uint64_t dev, ino; /* both 0: not recorded */
    int64_t offset;    /* -1: cannot seek (the worker reads its own) */
} sl_file_record;

/* File status flags a fresh description keeps (_reopen._KEPT_STATUS_FLAGS; the access mode is
 * read-only). O_LARGEFILE is 0 on 64-bit builds, as in Python's os module. */
#define KEPT_STATUS_FLAGS (O_NONBLOCK | O_DIRECT | O_NOATIME | O_LARGEFILE | O_SYNC | O_DSYNC)

enum { LOCK_FREE = 1, LOCK_HELD = 2 }; /* privatize_files' lock_states */

static int read_only(int flags) { return (flags & O_ACCMODE) == O_RDONLY && !(flags & O_PATH); }

/* The record of `fd` if it is a regular file (open read-only, with `only_read_only`): 1, else 0.
 * Its offset: -1 without `with_offset`. */
static int record_of(int fd, int only_read_only, sl_file_record *record, int with_offset) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return 0;  /* closed, or not a regular file */
    if (only_read_only) {
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || !read_only(flags)) return 0;
    }
    off_t offset = with_offset ? lseek(fd, 0, SEEK_CUR) : -1;
    record->fd = fd;
    record->dev = (uint64_t)st.st_dev;
    record->ino = (uint64_t)st.st_ino;
    record->offset = offset < 0 ? -1 : (int64_t)offset;
    return 1;
}

/* A growing array of records. */
typedef struct {
    sl_file_record *items;
    size_t count, size;
} records_t;

static int add_record(records_t *records, const sl_file_record *record) {
    if (records->count == records->size) {
        size_t size = records->size ? records->size * 2 : 64;
        sl_file_record *items = realloc(records->items, size * sizeof *items);
        if (items == NULL) { PyErr_NoMemory(); return -1; }
        records->items = items;
        records->size = size;
    }
    records->items[records->count++] = *record;
    return 0;
}

struct every {
    records_t *records;
    int only_read_only;
};

static int record_listed(long fd, int own, void *data) {
    struct every *every = data;
    sl_file_record record;
    if (fd == own || !record_of((int)fd, every->only_read_only, &record, 1)) return 1;
    return add_record(every->records, &record) < 0 ? -1 : 1;
}

/* file_records(fds, read_only) -> bytes: the record of each regular file among `fds` (a tuple of
 * descriptor numbers; None: every open descriptor), only those open read-only with `read_only`.
 * The parent's, right before a worker fork: the GIL is held throughout (os.lseek releases it per
 * file, and another thread may then keep it for milliseconds). */
PyObject *sl_file_records(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *fds;
    int only_read_only;
    if (!PyArg_ParseTuple(args, "Op:file_records", &fds, &only_read_only)) return NULL;
    if (fds != Py_None && !PyTuple_Check(fds))
        return PyErr_Format(PyExc_TypeError, "fds must be a tuple or None, got %.80s", Py_TYPE(fds)->tp_name);
    records_t records = {0};
    if (fds == Py_None) {
        struct every every = {&records, only_read_only};
        if (sl_each_proc_entry("/proc/self/fd", record_listed, &every) < 0) { free(records.items); return NULL; }
    } else {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fds); i++) {
            long fd = PyLong_AsLong(PyTuple_GET_ITEM(fds, i));
            if (fd == -1 && PyErr_Occurred()) { free(records.items); return NULL; }
            sl_file_record record;
            if (fd < 0 || fd > INT32_MAX || !record_of((int)fd, only_read_only, &record, 1)) continue;
            if (add_record(&records, &record) < 0) { free(records.items); return NULL; }
        }
    }
    PyObject *result = PyBytes_FromStringAndSize((const char *)records.items,
                                                 (Py_ssize_t)(records.count * sizeof(sl_file_record)));
    free(records.items);
    return result;
}

/* file_offsets(records) -> bytes: `records` (file_records' bytes, made once per loader start), each
 * with the offset its descriptor has now (-1: closed, or cannot seek). The parent's, before each
 * worker fork of the start: one lseek a file, where file_records adds an fstat (and, in the
 * parent holding thousands of files, a second pass over them). The identity stays the start's:
 * the worker privatizes a descriptor only while it still names that file (privatize_files). */
PyObject *sl_file_offsets(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer buffer;
    if (PyObject_GetBuffer(arg, &buffer, PyBUF_SIMPLE) < 0) return NULL;
    if (buffer.len % (Py_ssize_t)sizeof(sl_file_record) != 0) {
        PyBuffer_Release(&buffer);
        return PyErr_Format(PyExc_ValueError, "records must be file_records' bytes");
    }
    PyObject *result = PyBytes_FromStringAndSize(buffer.buf, buffer.len);
    PyBuffer_Release(&buffer);
    if (result == NULL) return NULL;
    sl_file_record *records = (sl_file_record *)PyBytes_AS_STRING(result);
    for (size_t i = 0; i < (size_t)PyBytes_GET_SIZE(result) / sizeof(sl_file_record); i++) {
        off_t offset = records[i].fd < 0 || records[i].fd > INT32_MAX ? -1 : lseek((int)records[i].fd, 0, SEEK_CUR);
        records[i].offset = offset < 0 ? -1 : (int64_t)offset;
    }
    return result;
}

/* The pair `at` of `paths`: its fd in `*fd` and its path ("" where not bytes without a NUL), or NULL
 * where it is not an (int, ...) pair. */
static const char *path_at(PyObject *paths, Py_ssize_t at, long *fd) {
    PyObject *pair = PyTuple_GET_ITEM(paths, at);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyLong_Check(PyTuple_GET_ITEM(pair, 0))) return NULL;
    *fd = PyLong_AsLong(PyTuple_GET_ITEM(pair, 0));
    if (*fd == -1 && PyErr_Occurred()) { PyErr_Clear(); return NULL; }
    PyObject *path = PyTuple_GET_ITEM(pair, 1);
    return PyBytes_Check(path) && (size_t)PyBytes_GET_SIZE(path) == strlen(PyBytes_AS_STRING(path))
               ? PyBytes_AS_STRING(path) : "";
}

/* The path `paths` (a tuple of (fd, bytes) sorted by fd) gives for `fd`, or NULL (none, or not
 * that shape: each item read, none made or written). `*next`: where the pair after the last one
 * found lies. The records come sorted by fd as `paths`
 * do: that pair is tried first (one look, not a search, for each of thousands of files). */
static const char *path_of(PyObject *paths, int fd, Py_ssize_t *next) {
    Py_ssize_t low = 0, high = PyTuple_GET_SIZE(paths);
    long value = -1;
    const char *path;
    if (*next < high && (path = path_at(paths, *next, &value)) != NULL && value == fd) {
        *next += 1;
        return *path ? path : NULL;
    }
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if ((path = path_at(paths, middle, &value)) == NULL) return NULL;
        if (value == fd) {
            *next = middle + 1;
            return *path ? path : NULL;
        }
        if (value < fd) low = middle + 1;
        else high = middle;
    }
    return NULL;
}

/* A fresh read-only descriptor of the file `found` (fd's fstat) by the path `paths` gives for
 * `fd`, with `flags`' status flags; -1 where there is none, it cannot be opened, or it names
 * another file now (the caller then reopens through /proc/self/fd). Opening a path walks cached
 * directory entries: about 5 us a file here, where /proc/self/fd/N costs a worker about 8 (its
 * entries are the new process's, made on first use). Opened non-blocking and without a
 * controlling terminal, so that a FIFO or device put at the path since does not hang the worker or
 * take its terminal; a regular file's O_NONBLOCK is then set as the original's. */
static int open_by_path(PyObject *paths, Py_ssize_t *next, int fd, int flags, const struct stat *found) {
    const char *path = PyTuple_GET_SIZE(paths) ? path_of(paths, fd, next) : NULL;
    if (path == NULL) return -1;
    int fresh = open(path, O_RDONLY | (flags & KEPT_STATUS_FLAGS) | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fresh < 0) return -1;
    struct stat st;
    if (fstat(fresh, &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == found->st_dev && st.st_ino == found->st_ino &&
        ((flags & O_NONBLOCK) || fcntl(fresh, F_SETFL, flags & KEPT_STATUS_FLAGS & ~O_NONBLOCK) == 0))
        return fresh;
    close(fresh);
    return -1;
}

static int compare_fds(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* The longs of a tuple of ints, in a new array (NULL with an error set; `*count` its length). */
static long *longs_of(PyObject *tuple, const char *what, Py_ssize_t *count) {
    if (!PyTuple_Check(tuple)) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple, got %.80s", what, Py_TYPE(tuple)->tp_name);
        return NULL;
    }
    *count = PyTuple_GET_SIZE(tuple);
    long *values = malloc(((size_t)*count + 1) * sizeof *values);
    if (values == NULL) { PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t i = 0; i < *count; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        values[i] = PyLong_Check(item) ? (long)PyLong_AsUnsignedLongLongMask(item) : -1;
        if (PyErr_Occurred()) { free(values); return NULL; }
    }
    return values;
}

/* privatize_files(records, skip, virtual_devices, check_locks, paths, lock_states=None, first=0) ->
 * (privatized, failed): in a worker, give each descriptor of `records` (file_records' bytes, made by
 * the parent) that is still a regular file open read-only its own open file description of the
 * same file, at the offset recorded (read now where the descriptor names another file since, or
 * none was recorded), with the same status flags and close-on-exec flag, under the same number:
 * every object holding the number keeps working, and the parent's descriptors are untouched.
 * Reopened by its path in `paths` where that still names the same file (open_by_path), else
 * through /proc/self/fd/N, which reaches the file even if moved or deleted. Skipped: the
 * descriptors of `skip` (a tuple), files on `virtual_devices` (st_dev values: /proc, /sys, /dev),
 * writable descriptors, and descriptions holding an exclusive lock (file_locks.c). `check_locks`:
 * the records are every read-only file at the fork, each description's locks read here; without
 * it they are the parent's vetted set (a loader's files), and a number naming another file than
 * its record is not one of them. `lock_states` (vetted records only): a writable buffer of one
 * byte a record, shared by the start's workers (a MAP_SHARED mapping the parent made before the
 * forks): 0 not read yet, else LOCK_FREE or LOCK_HELD; a worker reads a description's locks only
 * where no worker of the start has, and stores what it found. `first`: the record to begin with
 * (going round): the start's workers begin at different records, so each reads the locks of its
 * own share, where they find the others' results. `privatized`: a tuple of the descriptors given
 * their own description; `failed`: a tuple of (descriptor, errno) of those that could not be
 * (left shared as they were). */
PyObject *sl_privatize_files(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer buffer, states_buffer = {0};
    PyObject *skip_tuple, *virtual_tuple, *paths, *states_object = Py_None;
    int check_locks;
    Py_ssize_t first = 0;
    if (!PyArg_ParseTuple(args, "y*OOpO!|On:privatize_files", &buffer, &skip_tuple, &virtual_tuple, &check_locks,
                          &PyTuple_Type, &paths, &states_object, &first))
        return NULL;
    PyObject *result = NULL, *privatized = NULL, *failed = NULL;
    unsigned char *states = NULL;
    long *skip = NULL, *virtual_devices = NULL;
    int *done = NULL, *failures = NULL;
    int fd_dir = -1, info_dir = -1;
    Py_ssize_t skips = 0, virtuals = 0, done_count = 0, failed_count = 0, next_path = 0;
    if (buffer.len % (Py_ssize_t)sizeof(sl_file_record) != 0) {
        PyErr_SetString(PyExc_ValueError, "records must be file_records' bytes");
        goto out;
    }
    const sl_file_record *records = buffer.buf;
    size_t count = (size_t)buffer.len / sizeof(sl_file_record);
    if (states_object != Py_None) {
        if (PyObject_GetBuffer(states_object, &states_buffer, PyBUF_WRITABLE) < 0) goto out;
        if ((size_t)states_buffer.len != count) {
            PyErr_Format(PyExc_ValueError, "lock_states must hold one byte a record (%zu), got %zd", count,
                         states_buffer.len);
            goto out;
        }
        states = states_buffer.buf;
    }
    if (first < 0) {
        PyErr_Format(PyExc_ValueError, "first must be >= 0, got %zd", first);
        goto out;
    }
    if ((skip = longs_of(skip_tuple, "skip", &skips)) == NULL) goto out;
    if ((virtual_devices = longs_of(virtual_tuple, "virtual_devices", &virtuals)) == NULL) goto out;
    qsort(skip, (size_t)skips, sizeof *skip, compare_fds);
    done = malloc((count + 1) * sizeof *done);
    failures = malloc((count + 1) * 2 * sizeof *failures);
    if (done == NULL || failures == NULL) { PyErr_NoMemory(); goto out; }
    if (count) {  /* entries opened relative to their directory: a shorter lookup. Without a descriptor
                   * to spare (EMFILE), by their full path: each reopen then fails on its own, reported. */
        fd_dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (check_locks || states) info_dir = open("/proc/self/fdinfo", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    for (size_t step = 0; step < count; step++) {
        size_t i = ((size_t)first + step) % count;
        const sl_file_record *record = &records[i];
        if (record->fd < 0 || record->fd > INT32_MAX) continue;
        int fd = (int)record->fd;
        long key = fd;
        if (skips && bsearch(&key, skip, (size_t)skips, sizeof *skip, compare_fds) != NULL) continue;
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) continue;  /* closed, or another kind of file since */
        /* Identity 0/0: not recorded (a loader's files: the descriptor the worker inherited is the one
         * its offset was read from at the fork, whatever it names). */
        int same = (record->dev == 0 && record->ino == 0) ||
                   (record->dev == (uint64_t)st.st_dev && record->ino == (uint64_t)st.st_ino);
        /* Without check_locks the records are the parent's vetted set (a loader's files, their locks
         * read at the start): a number that names another file now is not one of them. */
        if (!same && !check_locks) continue;
        int is_virtual = 0;
        for (Py_ssize_t v = 0; v < virtuals; v++) is_virtual |= (unsigned long)virtual_devices[v] == (unsigned long)st.st_dev;
        if (is_virtual) continue;
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || !read_only(flags)) continue;
        char entry[40], info[40];
        snprintf(entry, sizeof entry, "/proc/self/fd/%d", fd);
        snprintf(info, sizeof info, "/proc/self/fdinfo/%d", fd);
        const char *name = strrchr(entry, '/') + 1;
        if (check_locks || states) {
            /* Relaxed: a byte is written once per start with the answer any worker finds (the
             * description is the one they all inherited), and read no matter how stale. */
            int state = states ? __atomic_load_n(&states[i], __ATOMIC_RELAXED) : 0;
            if (state == 0) {
                state = sl_holds_exclusive_lock(info_dir, info_dir >= 0 ? name : info) ? LOCK_HELD : LOCK_FREE;
                if (states) __atomic_store_n(&states[i], (unsigned char)state, __ATOMIC_RELAXED);
            }
            if (state == LOCK_HELD) continue;
        }
        /* The parent's offset at the fork, where the descriptor still names that file: the parent runs
         * on while the worker starts, and may have moved the shared offset since. */
        off_t offset = record->offset;
        if (!same || offset < 0) offset = lseek(fd, 0, SEEK_CUR);
        int error = 0, fresh = -1;
        if (offset < 0) error = errno;
        else if ((fresh = open_by_path(paths, &next_path, fd, flags, &st)) < 0 &&
                 (fresh = openat(fd_dir >= 0 ? fd_dir : AT_FDCWD, fd_dir >= 0 ? name : entry,
                                 O_RDONLY | (flags & KEPT_STATUS_FLAGS) | O_CLOEXEC)) < 0)
            error = errno;
        else if (offset > 0 && lseek(fresh, offset, SEEK_SET) < 0) error = errno;
        else {
            int fd_flags = fcntl(fd, F_GETFD);
            if (fd_flags < 0 || ((fd_flags & FD_CLOEXEC) ? dup3(fresh, fd, O_CLOEXEC) : dup2(fresh, fd)) < 0) error = errno;
        }
        if (fresh >= 0) close(fresh);
        if (error) {
            failures[2 * failed_count] = fd;
            failures[2 * failed_count + 1] = error;
            failed_count++;
        } else {
            done[done_count++] = fd;
        }
    }
    if ((privatized = PyTuple_New(done_count)) == NULL || (failed = PyTuple_New(failed_count)) == NULL) goto out;
    for (Py_ssize_t i = 0; i < done_count; i++) {
        PyObject *value = PyLong_FromLong(done[i]);
        if (value == NULL) goto out;
        PyTuple_SET_ITEM(privatized, i, value);
    }
    for (Py_ssize_t i = 0; i < failed_count; i++) {
        PyObject *pair = Py_BuildValue("(ii)", failures[2 * i], failures[2 * i + 1]);
        if (pair == NULL) goto out;
        PyTuple_SET_ITEM(failed, i, pair);
    }
    result = PyTuple_Pack(2, privatized, failed);
out:
    if (fd_dir >= 0) close(fd_dir);
    if (info_dir >= 0) close(info_dir);
    Py_XDECREF(privatized);
    Py_XDECREF(failed);
    free(skip);
    free(virtual_devices);
    free(done);
    free(failures);
    PyBuffer_Release(&states_buffer); /* a no-op where none was taken (obj NULL) */
    PyBuffer_Release(&buffer);
    return result;
}
