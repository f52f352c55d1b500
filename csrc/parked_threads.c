/*
 * stop_if_parked(functions, interpreter): call C functions that take nothing (OpenBLAS's
 * blas_thread_shutdown_, of copies only Python threads call: safeloader/backends/_openblas_stop.py)
 * only while every other Python thread of this process is parked where it cannot reach them, the
 * GIL held from the check to the last call's return.
 *
 * The condition, for each other thread state of the (one) interpreter: its thread is blocked in a
 * system call (/proc/self/task/TID/syscall, read twice, the same both times), at an instruction of
 * `interpreter`'s code, and every return address on its stack (a word into executable code that
 * follows a call instruction; other words are stale data) is into `interpreter`'s code: the Python
 * binary, libpython, the C runtime, the stdlib's lib-dynload modules. When its system call returns,
 * that code can only take it back to the eval loop, which needs the GIL this thread holds; a thread
 * inside numpy or scipy (BLAS in progress, its job queued to the threads being stopped) has their
 * return addresses on its stack. The GIL is never released here (no Python code runs, no
 * Py_BEGIN_ALLOW_THREADS): a thread that is not checked yet, or that wakes after its check, cannot
 * run Python code meanwhile. A thread inside a signal handler (a signal frame: glibc's sigreturn
 * trampoline on its stack) may resume interrupted code of any object: not parked. Anything not as expected (a thread running, unreadable /proc, a stack
 * over 8 MB, a thread state not bound to a thread yet, several interpreters, no GIL) -> no call.
 *
 * Why C: a Python-level sequence gives the GIL up at any bytecode boundary once another thread asks
 * for it (a thread whose system call returned), between the check and the stop.
 */
#include "native.h" /* first: Python.h (its pyconfig.h defines _GNU_SOURCE) */

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define STACK_LIMIT (8u << 20) /* a parked thread's live frames take a few KB */

typedef struct {
    unsigned long long start, end;
    int code, allowed; /* executable; of `interpreter`'s objects */
} region_t;

typedef struct {
    region_t *items;
    size_t count;
} regions_t;

/* The whole of a /proc file in a malloc'd buffer (*length bytes, NUL-terminated), or NULL. */
static char *read_file(const char *path, size_t *length) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t capacity = 1 << 16, used = 0;
    char *data = malloc(capacity);
    while (data != NULL) {
        if (used + 1 == capacity) {
            char *grown = realloc(data, 2 * capacity);
            if (grown == NULL) { free(data); data = NULL; break; }
            data = grown;
            capacity *= 2;
        }
        ssize_t got = read(fd, data + used, capacity - 1 - used);
        if (got < 0) { free(data); data = NULL; break; }
        if (got == 0) { data[used] = '\0'; *length = used; break; }
        used += (size_t)got;
    }
    close(fd);
    return data;
}

/* Whether the mapped file `path` (`length` bytes) is one of `interpreter` (bytes: an exact path,
 * or a directory's path ending in '/' for the files directly in it). */
static int is_interpreter(const char *path, size_t length, PyObject *interpreter) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(interpreter); i++) {
        PyObject *item = PyTuple_GET_ITEM(interpreter, i);
        const char *entry = PyBytes_AS_STRING(item);
        size_t size = (size_t)PyBytes_GET_SIZE(item);
        if (size == 0) continue;
        if (entry[size - 1] == '/') {
            if (length > size && memcmp(path, entry, size) == 0 && memchr(path + size, '/', length - size) == NULL)
                return 1;
        } else if (length == size && memcmp(path, entry, size) == 0) {
            return 1;
        }
    }
    return 0;
}

/* /proc/self/maps as regions, sorted by address; 0, or -1 where it cannot be read. */
static int read_regions(regions_t *regions, PyObject *interpreter) {
    size_t length;
    char *text = read_file("/proc/self/maps", &length);
    if (text == NULL) return -1;
    size_t lines = 1;
    for (size_t i = 0; i < length; i++) lines += text[i] == '\n';
    regions->items = malloc(lines * sizeof(region_t));
    regions->count = 0;
    if (regions->items == NULL) { free(text); return -1; }
    for (char *line = text, *eol; line < text + length; line = eol + 1) {
        eol = memchr(line, '\n', (size_t)(text + length - line));
        if (eol == NULL) eol = text + length;
        *eol = '\0';
        unsigned long long start, end;
        char perms[8];
        int consumed = 0;
        if (sscanf(line, "%llx-%llx %7s %*s %*s %*s%n", &start, &end, perms, &consumed) < 3) continue;
        char *path = line + consumed;
        while (*path == ' ') path++;
        region_t *region = &regions->items[regions->count++];
        region->start = start;
        region->end = end;
        region->code = perms[2] == 'x';
        region->allowed = region->code && path[0] == '/' && is_interpreter(path, (size_t)(eol - path), interpreter);
    }
    free(text);
    return 0;
}

static const region_t *region_at(const regions_t *regions, unsigned long long address) {
    size_t low = 0, high = regions->count;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (regions->items[middle].end <= address) low = middle + 1;
        else high = middle;
    }
    return low < regions->count && regions->items[low].start <= address ? &regions->items[low] : NULL;
}

/* Whether the 8 bytes before a return address end with a call instruction (the Python twin:
 * thread_owners._after_call, which says why each form). 1 on other machines: every word counts. */
static int after_call(const unsigned char *code) {
#if defined(__x86_64__)
    if (code[3] == 0xE8) return 1;
    static const int lengths[] = {2, 3, 4, 6, 7};
    for (int i = 0; i < 5; i++) {
        int length = lengths[i];
        unsigned char opcode = code[8 - length], modrm = code[9 - length];
        if (opcode != 0xFF || ((modrm >> 3) & 7) != 2) continue;
        int mod = modrm >> 6, rm = modrm & 7, sib = rm == 4, sib_at = 10 - length, found;
        if (mod == 3) found = 2;
        else if (mod == 1) found = 3 + sib;
        else if (mod == 2) found = 6 + sib;
        else if (rm == 5) found = 6;
        else if (sib && sib_at < 8 && (code[sib_at] & 7) == 5) found = 7;
        else found = 2 + sib;
        if (found == length) return 1;
    }
    return 0;
#elif defined(__aarch64__)
    unsigned int insn;
    memcpy(&insn, code + 4, 4);
    return (insn & 0xFC000000u) == 0x94000000u || (insn & 0xFFFFFC1Fu) == 0xD63F0000u ||
           (insn & 0xFEFFF800u) == 0xD63F0800u;
#else
    (void)code;
    return 1;
#endif
}

/* The syscall line of thread `tid` and its stack and instruction pointers; 0 if it is blocked in
 * a system call, -1 otherwise (running, not in a system call, gone, unparsable). */
static int blocked(long tid, char *line, size_t size, unsigned long long *sp, unsigned long long *pc) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t got = read(fd, line, size - 1);
    close(fd);
    if (got <= 0) return -1;
    line[got] = '\0';
    long number;
    if (sscanf(line, "%ld", &number) != 1 || number < 0) return -1; /* "running", or -1: no system call */
    char *last = strrchr(line, ' '), *before;
    if (last == NULL || last == line) return -1;
    *last = '\0';
    before = strrchr(line, ' ');
    *last = ' ';
    if (before == NULL) return -1;
    return sscanf(before, " %llx %llx", sp, pc) == 2 ? 0 : -1;
}

/* Where a signal handler returns to (glibc's sigreturn trampoline, the same for every handler it
 * installs), or 0: found on a stack, it marks a signal frame, whose saved context may resume any
 * code (numpy's, interrupted) with no return address of that code on the stack. x86-64 only:
 * elsewhere the kernel's own trampoline (the vDSO's) is used, and then no thread counts as parked. */
static unsigned long long signal_return(void) {
#if defined(__x86_64__)
#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000 /* the kernel's (asm/signal.h); glibc's headers do not name it */
#endif
    for (int signum = 1; signum < NSIG; signum++) {
        struct sigaction action;
        if (sigaction(signum, NULL, &action) == 0 && (action.sa_flags & SA_RESTORER) && action.sa_restorer)
            return (unsigned long long)(uintptr_t)action.sa_restorer;
    }
#endif
    return 0;
}

/* Why thread `tid` is not parked in `interpreter`'s code (a static string), or NULL if it is. */
static const char *not_parked(long tid, const regions_t *regions, int memory, unsigned long long restorer) {
    char first[256], again[256];
    unsigned long long sp, pc, sp2, pc2;
    if (blocked(tid, first, sizeof first, &sp, &pc) < 0) return "a Python thread not blocked in a system call";
    const region_t *at = region_at(regions, pc), *stack = region_at(regions, sp);
    if (at == NULL || !at->allowed) return "a Python thread blocked outside the interpreter's code";
    if (stack == NULL || stack->end - sp > STACK_LIMIT) return "a Python thread's stack not found";
    size_t size = (size_t)(stack->end - sp);
    unsigned char *data = malloc(size);
    if (data == NULL) return "no memory";
    const char *why = NULL;
    if (pread(memory, data, size, (off_t)sp) != (ssize_t)size) why = "a Python thread's stack unreadable";
    for (size_t i = 0; why == NULL && i + sizeof(unsigned long long) <= size; i += sizeof(unsigned long long)) {
        unsigned long long word;
        memcpy(&word, data + i, sizeof word);
        if (restorer != 0 && word == restorer) { why = "a Python thread in a signal handler"; break; }
        const region_t *region = region_at(regions, word);
        /* A call's return address follows it in the same mapping (a pointer to a mapping's
         * first bytes, such as the auxiliary vector's to the vDSO, is none). */
        if (region == NULL || !region->code || region->allowed || word - 8 < region->start) continue;
        unsigned char code[8];
        if (pread(memory, code, 8, (off_t)(word - 8)) != 8 || after_call(code))
            why = "a Python thread with a return address outside the interpreter's code";
    }
    free(data);
    if (why == NULL && (blocked(tid, again, sizeof again, &sp2, &pc2) < 0 || strcmp(first, again) != 0))
        why = "a Python thread that moved while it was read";
    return why;
}

/* stop_if_parked(functions, interpreter) -> None where each function was called, else why not. */
PyObject *sl_stop_if_parked(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *functions, *interpreter;
    if (!PyArg_ParseTuple(args, "O!O!:stop_if_parked", &PyTuple_Type, &functions, &PyTuple_Type, &interpreter))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(interpreter); i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(interpreter, i))) {
            PyErr_SetString(PyExc_TypeError, "interpreter: a tuple of bytes");
            return NULL;
        }
    void *addresses[16];
    Py_ssize_t count = PyTuple_GET_SIZE(functions);
    if (count > 16) return PyUnicode_FromString("too many functions");
    for (Py_ssize_t i = 0; i < count; i++) {
        addresses[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(functions, i));
        if (addresses[i] == NULL) return PyErr_Occurred() ? NULL : PyUnicode_FromString("a null function");
    }
#if defined(Py_GIL_DISABLED)
    return PyUnicode_FromString("no GIL");
#elif PY_VERSION_HEX < 0x030B0000
    return PyUnicode_FromString("Python < 3.11: a thread state names no native thread");
#else
    /* From here to the calls, nothing releases the GIL. */
    if (PyInterpreterState_Next(PyInterpreterState_Head()) != NULL) return PyUnicode_FromString("several interpreters");
    regions_t regions = {NULL, 0};
    if (read_regions(&regions, interpreter) < 0) return PyUnicode_FromString("/proc/self/maps unreadable");
    int memory = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    const char *why = memory < 0 ? "/proc/self/mem unreadable" : NULL;
    unsigned long long restorer = signal_return();
    if (restorer == 0) why = "no sigreturn trampoline known";
    PyThreadState *self_state = PyThreadState_Get();
    for (PyThreadState *state = PyInterpreterState_ThreadHead(PyInterpreterState_Get());
         why == NULL && state != NULL; state = PyThreadState_Next(state)) {
        if (state == self_state) continue;
        why = state->native_thread_id == 0 ? "a Python thread not started yet"
                                           : not_parked((long)state->native_thread_id, &regions, memory, restorer);
    }
    if (memory >= 0) close(memory);
    free(regions.items);
    if (why != NULL) return PyUnicode_FromString(why);
    for (Py_ssize_t i = 0; i < count; i++) ((int (*)(void))addresses[i])();
    Py_RETURN_NONE;
#endif
}
