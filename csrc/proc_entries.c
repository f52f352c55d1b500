/*
 * The numbered entries of a /proc directory (/proc/self/task, /proc/self/fd), listed without
 * allocating: the walk threads.c's threads_within and descriptors.c's descriptor_kinds share
 * (and private_files.c's file_records, which allocates its records).
 *
 * Why native: they run in the parent between a loader start's worker forks, where every object
 * allocated or freed writes a page the workers forked so far share (a copy-on-write fault each).
 * Python's os.listdir/os.scandir allocate per entry, and opendir allocates with malloc; here
 * nothing is allocated, Python's or malloc's (getdents64 into a buffer on the stack).
 */
#include "native.h" /* first: Python.h */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* What getdents64 writes into the buffer, one entry after another. */
struct proc_dirent64 {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* Each numbered entry of `path` given to `visit(number, own, data)` (`own`: the listing's own
 * descriptor) until it returns 0 (stop) or -1 (a Python error set). Returns 0, or -1 with a
 * Python error set. */
int sl_each_proc_entry(const char *path, int (*visit)(long, int, void *), void *data) {
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
