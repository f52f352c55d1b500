/*
 * The dynamic loader's list of loaded objects: loaded_objects() (its load and unload counters,
 * and the objects' names), and sl_loaded_counters for fast_fork.c.
 *
 * Why native: the walk (dl_iterate_phdr) holds the dynamic loader's lock throughout. In C no
 * Python code runs while it is held (the fallback's ctypes callback is Python): the walk runs C
 * only, the Python objects are built after it, and the GIL is released meanwhile or held as
 * safeloader/_loader_lock.py decides. fast_fork.c reads the counters between a loader start's
 * forks, allocating nothing.
 */
#include "native.h" /* first: Python.h (its pyconfig.h defines _GNU_SOURCE, which link.h needs) */

#include <link.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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
PyObject *sl_loaded_objects(PyObject *Py_UNUSED(self), PyObject *args) {
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
