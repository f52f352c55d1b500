/*
 * The Python frames of a thread of another process, read from outside: the file and function
 * of each frame of a forked worker's main thread, innermost first, read by its parent with
 * process_vm_readv. Nothing is sent to the worker and nothing runs in it, where faulthandler's
 * dump, asked with a signal, runs in the interrupted thread: it leaves errno as its own writes
 * set it (see backtrace.c), and it walks the frames wherever the signal landed, also inside
 * the interpreter's frame push, where the thread's current frame is not set yet: it follows a
 * stale pointer and the worker dies of a segmentation fault (seen once in about 2000 signals
 * sent to a worker spinning in pyzmq's retry loop, which makes a Python frame on every turn).
 *
 * The parent reads the same layout it runs: the worker is its fork (same interpreter, same
 * addresses of the code and str types). Where the current frame lies in a thread state is in
 * the public headers (3.10: tstate->frame; 3.11-3.12: tstate->cframe->current_frame; 3.13+:
 * tstate->current_frame), and so are the code object's and str's layouts. Where the code object
 * and the link to the caller lie in an interpreter frame (3.11+) is internal: it is found once,
 * in this process, from two Python frames whose code objects are known (probe_python_frames:
 * the words of the current frame that hold the first's code and point to a frame holding the
 * second's). 3.10's frames are objects whose layout is public.
 *
 * The worker runs meanwhile: a frame can be pushed, popped or reused between two reads. Every
 * pointer is read with process_vm_readv (an unmapped address is an error, never a fault), a
 * frame counts only where its code object's type is the code type, a name only where its type
 * is str, and the walk stops after FRAMES_MAX frames (a torn link cannot loop for ever). The
 * answer is one plausible stack, to be taken as a sample, not as a proof.
 */
#include "native.h" /* first: Python.h */

#include <frameobject.h> /* 3.10: the frame object's layout; 3.11+: PyFrame_GetBack, PyFrame_GetCode */

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* Words of an interpreter frame searched for its code object and its caller's frame: the
 * "specials" and linkage sections, the first 8 words in every version (3.11: the code in word 4,
 * the caller in word 6; 3.12+: 0 and 1). The words after them are the frame's locals and value
 * stack, which can hold anything, the caller's address too (stale values of an earlier frame). */
#define PROBE_WORDS 8
/* Frames walked at most, innermost first: deeper stacks are cut (a torn link ends here too). */
#define FRAMES_MAX 128
/* Characters kept of a file or function name (longer ones are cut). */
#define NAME_MAX_CHARS 1024
/* Low bits of a code reference that are not address: 3.14's stack references tag bit 0; objects
 * are aligned to 8 bytes at least. */
#define REFERENCE_TAGS ((uintptr_t)7)

/* Offsets found by probe_python_frames (3.11+), or fixed (3.10). Written once, before any read;
 * a second probe from another thread writes the same values. */
static atomic_int layout_state = 0; /* 0: not probed, 1: known, -1: not found */
static size_t code_at, previous_at;

static int read_remote(pid_t pid, uintptr_t address, void *buffer, size_t size) {
    struct iovec local = {buffer, size};
    struct iovec remote = {(void *)address, size};
    ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    return got == (ssize_t)size ? 0 : -1;
}

static int read_word(pid_t pid, uintptr_t address, uintptr_t *word) {
    return read_remote(pid, address, word, sizeof(*word));
}

/* The address of the thread's current frame (interpreter frame; 3.10: frame object). */
static int current_frame_of(pid_t pid, uintptr_t tstate, uintptr_t *frame) {
#if PY_VERSION_HEX < 0x030B0000
    return read_word(pid, tstate + offsetof(PyThreadState, frame), frame);
#elif PY_VERSION_HEX < 0x030D0000
    uintptr_t cframe;
    if (read_word(pid, tstate + offsetof(PyThreadState, cframe), &cframe) != 0 || cframe == 0) return -1;
    return read_word(pid, cframe + offsetof(_PyCFrame, current_frame), frame);
#else
    return read_word(pid, tstate + offsetof(PyThreadState, current_frame), frame);
#endif
}

/* Whether the object at `object` (in `pid`) has type `type`. */
static int has_type(pid_t pid, uintptr_t object, PyTypeObject *type) {
    uintptr_t found;
    if (object == 0 || (object & REFERENCE_TAGS) != 0) return 0;
    if (read_word(pid, object + offsetof(PyObject, ob_type), &found) != 0) return 0;
    return found == (uintptr_t)type;
}

#if PY_VERSION_HEX >= 0x030B0000
/* The words of `frame` (this process's), read safely. */
static int frame_words(uintptr_t frame, uintptr_t words[PROBE_WORDS]) {
    return frame == 0 ? -1 : read_remote(getpid(), frame, words, PROBE_WORDS * sizeof(uintptr_t));
}

/* Find code_at and previous_at from the current frame (the Python function calling this, whose
 * code is `inner`) and its caller's (code `outer`): exactly one pair of words must fit. */
static int probe(PyCodeObject *inner, PyCodeObject *outer) {
    uintptr_t frame, words[PROBE_WORDS], caller[PROBE_WORDS];
    if (current_frame_of(getpid(), (uintptr_t)PyThreadState_Get(), &frame) != 0) return -1;
    if (frame_words(frame, words) != 0) return -1;
    int found = 0;
    size_t code_word = 0, previous_word = 0;
    for (size_t k = 0; k < PROBE_WORDS; k++) {
        if ((words[k] & ~REFERENCE_TAGS) != (uintptr_t)inner) continue;
        for (size_t w = 0; w < PROBE_WORDS; w++) {
            if (w == k || words[w] == 0 || (words[w] & REFERENCE_TAGS) != 0) continue;
            if (frame_words(words[w], caller) != 0) continue;
            if ((caller[k] & ~REFERENCE_TAGS) != (uintptr_t)outer) continue;
            found++;
            code_word = k;
            previous_word = w;
        }
    }
    if (found != 1) return -1;
    code_at = code_word * sizeof(uintptr_t);
    previous_at = previous_word * sizeof(uintptr_t);
    return 0;
}
#endif

PyObject *sl_probe_python_frames(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    int state = atomic_load(&layout_state);
    if (state != 0) return PyBool_FromLong(state > 0);
#if PY_VERSION_HEX < 0x030B0000
    code_at = offsetof(PyFrameObject, f_code);
    previous_at = offsetof(PyFrameObject, f_back);
    state = 1;
#else
    PyFrameObject *inner_frame = PyEval_GetFrame(); /* borrowed: the caller's, in Python */
    if (inner_frame == NULL) Py_RETURN_FALSE;
    PyFrameObject *outer_frame = PyFrame_GetBack(inner_frame);
    if (outer_frame == NULL) Py_RETURN_FALSE;
    PyCodeObject *inner = PyFrame_GetCode(inner_frame);
    PyCodeObject *outer = PyFrame_GetCode(outer_frame);
    state = inner != outer && probe(inner, outer) == 0 ? 1 : -1;
    Py_DECREF(inner);
    Py_DECREF(outer);
    Py_DECREF(outer_frame);
#endif
    atomic_store(&layout_state, state);
    return PyBool_FromLong(state > 0);
}

/* The str at `object` (in `pid`) as a Python str (its first NAME_MAX_CHARS characters), or
 * NULL without an exception where it is not a compact ASCII or Latin-1 str. */
static PyObject *read_text(pid_t pid, uintptr_t object) {
    PyCompactUnicodeObject header; /* the larger of the two compact headers */
    if (!has_type(pid, object, &PyUnicode_Type)) return NULL;
    if (read_remote(pid, object, &header, sizeof(header)) != 0) return NULL;
    PyASCIIObject *ascii = (PyASCIIObject *)&header;
    if (!ascii->state.compact) return NULL;
    uintptr_t data;
    if (ascii->state.ascii) {
        data = object + sizeof(PyASCIIObject);
    } else if (ascii->state.kind == PyUnicode_1BYTE_KIND) {
        data = object + sizeof(PyCompactUnicodeObject);
    } else {
        return NULL;
    }
    char text[NAME_MAX_CHARS];
    size_t length = ascii->length < 0 ? 0 : (size_t)ascii->length;
    if (length > sizeof(text)) length = sizeof(text);
    if (length > 0 && read_remote(pid, data, text, length) != 0) return NULL;
    return PyUnicode_DecodeLatin1(text, (Py_ssize_t)length, "replace");
}

/* (file, function) of the code object at `code` (in `pid`), or NULL without an exception where
 * it is not a code object. */
static PyObject *read_code(pid_t pid, uintptr_t code) {
    uintptr_t file_object, name_object;
    if (!has_type(pid, code, &PyCode_Type)) return NULL;
    if (read_word(pid, code + offsetof(PyCodeObject, co_filename), &file_object) != 0) return NULL;
    if (read_word(pid, code + offsetof(PyCodeObject, co_name), &name_object) != 0) return NULL;
    PyObject *file = read_text(pid, file_object);
    if (file == NULL) return NULL;
    PyObject *name = read_text(pid, name_object);
    if (name == NULL) name = PyUnicode_FromString("?");
    if (name == NULL) { Py_DECREF(file); return NULL; }
    return Py_BuildValue("(NN)", file, name);
}

PyObject *sl_python_frames(PyObject *Py_UNUSED(self), PyObject *args) {
    int pid;
    unsigned long long tstate;
    if (!PyArg_ParseTuple(args, "iK:python_frames", &pid, &tstate)) return NULL;
    if (atomic_load(&layout_state) <= 0 || tstate == 0) Py_RETURN_NONE;
    uintptr_t frame;
    if (current_frame_of((pid_t)pid, (uintptr_t)tstate, &frame) != 0) Py_RETURN_NONE;
    PyObject *frames = PyList_New(0);
    if (frames == NULL) return NULL;
    for (int walked = 0; frame != 0 && walked < FRAMES_MAX; walked++) {
        uintptr_t code, previous;
        if (read_word((pid_t)pid, frame + code_at, &code) != 0) break;
        if (read_word((pid_t)pid, frame + previous_at, &previous) != 0) break;
        /* A frame whose code is not a code object is skipped (3.12+'s entry frames, or a frame
         * being pushed); its link is still followed. */
        PyObject *entry = read_code((pid_t)pid, code & ~REFERENCE_TAGS);
        if (entry == NULL && PyErr_Occurred()) { Py_DECREF(frames); return NULL; }
        if (entry != NULL) {
            int failed = PyList_Append(frames, entry);
            Py_DECREF(entry);
            if (failed) { Py_DECREF(frames); return NULL; }
        }
        frame = previous;
    }
    return frames;
}

PyObject *sl_thread_state(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    return PyLong_FromVoidPtr(PyThreadState_Get());
}
