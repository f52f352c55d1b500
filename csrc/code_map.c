/*
 * Where the loaded code lies in this process's memory, for thread attribution (which shared
 * object started each native thread, from the code addresses on its stack,
 * safeloader/diagnostics/thread_owners.py): code_segments() from the dynamic loader's list,
 * parse_maps() from the text of /proc/self/maps, for the mapping that holds a stack where the
 * kernel cannot say (PROCMAP_QUERY, Linux 6.11+).
 *
 * Why native: speed, at a loader's first start as in the stall report. The loader's list,
 * walked in C, takes about 0.1 ms, where /proc/self/maps costs the kernel 2-3 ms to write out
 * in a process with 300 libraries; the walk holds the loader's lock, so it runs C only, as
 * loaded_objects.c's does. Parsing /proc/self/maps in Python took 2 ms for 1700 mappings.
 */
#include "native.h" /* first: Python.h (its pyconfig.h defines _GNU_SOURCE, which link.h needs) */

#include <link.h>
#include <stdlib.h>
#include <string.h>

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
PyObject *sl_code_segments(PyObject *Py_UNUSED(self), PyObject *args) {
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
PyObject *sl_parse_maps(PyObject *Py_UNUSED(self), PyObject *arg) {
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
