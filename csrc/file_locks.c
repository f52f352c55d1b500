/*
 * Whether an open file description holds an exclusive flock or OFD lock (exclusively_locked; the
 * "files" hook, safeloader/backends/files.py): such a description is a lock, not a data handle,
 * and a worker re-locking a private copy would block on the parent's lock, so it stays shared.
 *
 * Why native: a Dataset may hold thousands of files, and the parent reads each one's locks once per
 * loader start (about 2 us a file in the kernel: /proc/self/fdinfo/<fd> opened, read and closed).
 * In Python each read cost as much again in objects (a 64 KiB bytes object, its split lines).
 */
#include "native.h" /* first: Python.h */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Whether `fd`'s open file description holds a write (exclusive) flock or OFD lock: such a
 * description is a lock, not a data handle, and a worker re-locking a private copy would block on
 * the parent's lock. Read from /proc/self/fdinfo/<fd> (`info`: that directory, or -1 and `name`
 * the full path), never from
 * /proc/locks: reading that takes the kernel's global file-lock semaphore for writing, which
 * waits for an RCU grace period (milliseconds, tens of them on a busy machine) and stalls every
 * lock call on the system. POSIX (fcntl) locks belong to the process, not to the description: a
 * worker holds none of them, and is not skipped. Unreadable: 0, as if unlocked. */
int sl_holds_exclusive_lock(int info, const char *name) {
    int file = openat(info >= 0 ? info : AT_FDCWD, name, O_RDONLY | O_CLOEXEC);
    if (file < 0) return 0;
    char stack[4096];
    char *text = stack;
    size_t size = sizeof stack, length = 0;
    for (;;) {  /* a short read is the end: one read unless the description holds many locks */
        if (length == size) {
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
    /* Each line: "lock:\t1: FLOCK  ADVISORY  WRITE <pid> <maj:min:inode> 0 EOF". */
    int found = 0;
    for (size_t start = 0; start < length && !found;) {
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
            found = 1;
        start = end + 1;
    }
    if (text != stack) free(text);
    return found;
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
