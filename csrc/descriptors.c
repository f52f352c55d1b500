/*
 * This process's descriptor table: what is open (descriptor_table, regular_file_offsets,
 * descriptor_kinds) and room for more (reserve_descriptor_slots, safeloader/_fd_table.py).
 *
 * Why native: the fork hooks that privatize files and sever connections ask these in the parent
 * before each worker fork and in each worker right after it, where every Python object made
 * writes a page shared with the parent or the workers (a copy-on-write fault each): os.fstat
 * builds a ~20-field stat_result per descriptor, and os.lseek releases the GIL per file (another
 * thread may then keep it for milliseconds). reserve_descriptor_slots, too, runs in each worker
 * right after the fork: in C it imports no module (fcntl, resource) and makes no object a step.
 */
#include "native.h" /* first: Python.h */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every open descriptor as (fd, st_mode, st_dev, st_ino), for the fork hooks that must
 * know what a worker inherited. In C because a worker runs it right after the fork:
 * os.fstat builds a ~20-field stat_result per descriptor, and each allocation there
 * writes to pages shared with the parent (a copy-on-write fault each). */
static PyObject *list_descriptors(int offsets);

PyObject *sl_descriptor_table(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) { return list_descriptors(0); }

/* (fd, st_dev, st_ino, offset) of every descriptor open on a regular file that can seek: what
 * the parent records before each worker fork. In C also so that the GIL is held throughout:
 * os.lseek releases it per file, and another Python thread may then keep it for milliseconds. */
PyObject *sl_regular_file_offsets(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
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
 * Allocates nothing (sl_each_proc_entry). A kind already seen is not asked again of the kernel (a
 * parent holding thousands of files: one fcntl, not one a file; once no kind of file is left to
 * find, one getsockopt a descriptor, not an fstat), and the listing stops once every kind of
 * `until` is seen (`any`: once one of them is). */
#define EVERY_KIND 7L

struct kinds {
    long kinds, until;
    int any;
};

static int socket_kind(int fd) {
    int domain = 0, type = 0;
    socklen_t size = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &size) != 0) return 0;  /* ENOTSOCK, EBADF */
    size = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &size) != 0) return 0;
    return (domain == AF_INET || domain == AF_INET6) && type == SOCK_STREAM ? 4 : 0;
}

static int add_kind(long fd, int own, void *data) {
    struct kinds *found = data;
    if (fd == own) return 1;  /* the listing's own */
    if (!(found->until & ~found->kinds & 3)) {
        /* No kind of file left to look for (a parent holding thousands of files, asked for sockets):
         * getsockopt answers ENOTSOCK for a file without the fstat (a quarter of its cost). */
        found->kinds |= socket_kind((int)fd);
        return (found->any ? (found->kinds & found->until) != 0 : (found->kinds & found->until) == found->until) ? 0 : 1;
    }
    struct stat st;
    if (fstat((int)fd, &st) != 0) return 1;  /* closed meanwhile */
    if (S_ISREG(st.st_mode)) {
        found->kinds |= 2;
        if (!(found->kinds & 1)) {
            int flags = fcntl((int)fd, F_GETFL);
            if (flags >= 0 && (flags & O_ACCMODE) == O_RDONLY && !(flags & O_PATH)) found->kinds |= 1;
        }
    } else if (S_ISSOCK(st.st_mode) && !(found->kinds & 4)) {
        found->kinds |= socket_kind((int)fd);
    }
    long seen = found->kinds & found->until;
    return (found->any ? seen != 0 : seen == found->until) ? 0 : 1;
}

/* The size of this process's descriptor table (every open descriptor is below it: /proc/self/status'
 * FDSize), or -1 where unreadable. */
static long table_size(void) {
    int file = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (file < 0) return -1;
    char text[4096];
    ssize_t length = read(file, text, sizeof text - 1);
    close(file);
    if (length <= 0) return -1;
    text[length] = '\0';
    const char *field = strstr(text, "\nFDSize:");
    return field == NULL ? -1 : strtol(field + 8, NULL, 10);
}

/* From this many open descriptors on, a dense table is probed number by number (a failed fstat or
 * getsockopt on a free number costs a fifth of listing an entry of /proc/self/fd, more on the
 * first listing in a process, where the kernel makes each entry). */
#define PROBE_FROM 1024

long sl_descriptor_kinds(long until, int any) {
    struct kinds found = {0, until & EVERY_KIND, any};
    if (found.until == 0) return 0;
    /* Since Linux 6.2 the size of /proc/self/fd is the number of open descriptors (0 before). */
    struct stat listing;
    if (stat("/proc/self/fd", &listing) == 0 && listing.st_size >= PROBE_FROM) {
        long size = table_size();
        if (size > 0 && size <= 4 * (long)listing.st_size) {  /* dense: a table of 4,096 for 4,000 files */
            for (long fd = 0; fd < size && fd <= INT_MAX; fd++)
                if (add_kind(fd, -1, &found) == 0) break;
            return found.kinds;
        }
    }
    return sl_each_proc_entry("/proc/self/fd", add_kind, &found) < 0 ? -1 : found.kinds;
}

PyObject *sl_descriptor_kinds_py(PyObject *Py_UNUSED(self), PyObject *args) {
    long until = EVERY_KIND;
    if (!PyArg_ParseTuple(args, "|l:descriptor_kinds", &until)) return NULL;
    long kinds = sl_descriptor_kinds(until, 0);
    return kinds < 0 ? NULL : PyLong_FromLong(kinds);
}

/* Make room in this process's descriptor table for `spare` descriptors above the lowest free
 * number (fewer where the RLIMIT_NOFILE soft limit is lower). A descriptor duplicated at that
 * number makes the kernel grow the table, which never shrinks, and is closed at once; F_DUPFD
 * takes the lowest free number at or above the one asked, so no open descriptor is touched.
 * Returns the table's slots asked of the kernel, 0 where nothing was done (no open descriptor
 * to duplicate, the limit reached). */
PyObject *sl_reserve_descriptor_slots(PyObject *Py_UNUSED(self), PyObject *arg) {
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
