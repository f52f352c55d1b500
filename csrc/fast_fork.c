/*
 * A loader start's later worker forks, recognised and checked in C (safeloader/_fast_fork.py).
 *
 * Why: between a start's worker forks the parent shares its pages with the workers forked so
 * far, and each page it writes is copied (a page fault, about 4 us here). Python code writes a
 * page for nearly every object it touches (a reference count): the registry's per-fork Python
 * wrote about 150 pages a fork. Reading does not copy, and this code only reads what Python
 * holds, except the few objects it must make (the Popen's frame and its locals).
 *
 * At a start's first fork the registry (Python) runs every hook, makes the start's plans and,
 * where each remaining per-fork hook is one this file can stand in for, arms this state with
 * what must still hold at a later fork for those plans to hold. A later fork of that start on
 * the same thread then takes the fast path if all of it holds:
 * - the same threads (no new one), loaded objects (the loader's counters) and sys.modules;
 * - watched module globals still the objects they were (the registrations' version; no
 *   dynamic-loader section running with the GIL released; torch's pin_memory the gate);
 * - no import running in another thread (importlib's module locks: an empty dict);
 * - gc enabled or not as it was between the forks the Python path made;
 * - no descriptor of a kind whose hook has work (a read-only file, a TCP socket);
 * - the fork is multiprocessing's Popen._launch of a Process whose target is the start's
 *   worker loop, with the worker id and count as positional arguments.
 * It then does what those hooks' `before` would: the watchdog's clock for the worker, the
 * Popen kept for an interrupted start, gc paused for the fork (the gc hook's, where it paused it:
 * resumed in `after_in_parent`, and in the worker by the gc hook's `after_in_child`, whose plan
 * says so); the other hooks (files, sockets) had nothing to do.
 * Anything else, or any error: the registry's Python path, unchanged.
 *
 * No Python code runs from this `before` through this `after_in_parent`, so no signal handler
 * can interrupt it and nothing is left to roll back after the fork. The child is told which
 * worker it is through sl_fast_fork_on_child (a pthread_atfork handler: it runs before any
 * Python code in the child).
 *
 * The state is process-wide (a start's forks are one thread's) and holds strong references
 * to the objects it compares against, released by disarm. Under a free-threaded Python,
 * arming is refused: the checks rely on the GIL being held from `before` to `after_in_parent`.
 * Only the interpreter that armed it uses it.
 */
#include "fast_fork.h"  /* Python.h first (its pyconfig.h defines _GNU_SOURCE) */

#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  /* PyFrame_GetBack: in Python.h from 3.11 */
#endif

#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int armed;
    PyInterpreterState *interp;
    unsigned long thread;  /* PyThread_get_thread_ident() of the starting thread */
    pid_t pid;
    int python_open;       /* a fork of the Python path is under way on the starting thread */
    /* what must hold */
    PyObject *thread_ids;  /* sorted tuple */
    unsigned long long adds, subs;
    PyObject *modules;     /* sys.modules, and its size, last name and module */
    Py_ssize_t modules_size;
    PyObject *last_name, *last_module;
    PyObject *reversed_name;  /* "__reversed__" */
    PyObject *globals;     /* tuple of (dict, key, object): dict[key] is object */
    PyObject *empty;       /* tuple of dicts that must be empty */
    int gc_enabled;        /* gc's state between forks */
    int pause_gc;          /* whether each fork pauses gc (the gc hook's `before` would) */
    long kinds_mask;
    PyObject *launch_code;
    PyObject *target;
    Py_ssize_t worker_index, workers_index, min_args, max_args;
    long num_workers;
    /* what a fast fork does */
    PyObject *launches;    /* list: each fast fork's Popen */
    Py_buffer clock;       /* the watch's slots (doubles), or .buf NULL */
    Py_ssize_t clock_stride, clock_offset;
    long forks;            /* fast forks since armed */
    /* the fork under way */
    int in_fork;
    int gc_paused;         /* this fork paused gc: resumed after it (or by the next, if cut short) */
    long worker_id;
} fast_fork_t;

static fast_fork_t fast;
/* In a child: the worker id and count its parent's fast fork made it, else in_fork 0. */
static struct { int in_fork; long worker_id, num_workers; } child;

/* Resume gc where a fast fork paused it and its after_in_parent did not run (an interrupt on the
 * first instruction of the registry's callback): the next fork, or the start's end, does it. */
static void resume_gc(void) {
    if (fast.gc_paused) {
        fast.gc_paused = 0;
        PyGC_Enable();
    }
}

static void clear(void) {
    resume_gc();
    if (fast.clock.buf != NULL) PyBuffer_Release(&fast.clock);
    Py_CLEAR(fast.thread_ids);
    Py_CLEAR(fast.modules);
    Py_CLEAR(fast.last_name);
    Py_CLEAR(fast.last_module);
    Py_CLEAR(fast.reversed_name);
    Py_CLEAR(fast.globals);
    Py_CLEAR(fast.empty);
    Py_CLEAR(fast.launch_code);
    Py_CLEAR(fast.target);
    Py_CLEAR(fast.launches);
    memset(&fast, 0, sizeof fast);
}

/* Whether the state is armed by this thread of this interpreter. */
static int armed_here(void) {
    return fast.armed && fast.thread == PyThread_get_thread_ident() && fast.interp == PyInterpreterState_Get();
}

void sl_fast_fork_on_child(void) {
    /* Only the forking thread is left. Nothing is released here (no Python may run, and
     * the references belong to the parent's objects, which the child keeps as inherited). */
    child.in_fork = fast.armed && fast.in_fork && fast.thread == PyThread_get_thread_ident();
    child.worker_id = fast.worker_id;
    child.num_workers = fast.num_workers;
    memset(&fast, 0, sizeof fast);
}

static double monotonic(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);  /* time.monotonic()'s clock on Linux */
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* Whether sys.modules has the size, last name and last module it had when armed: a new import
 * (or a name deleted and imported again) enters it last. The last name is found from the end,
 * as reversed() does (walking the whole dict from the start took 100 us with 3700 modules). */
static int modules_unchanged(void) {
    if (PySys_GetObject("modules") != fast.modules || PyDict_Size(fast.modules) != fast.modules_size) return 0;
    PyObject *backwards = PyObject_CallMethodNoArgs(fast.modules, fast.reversed_name);
    if (backwards == NULL) return 0;
    PyObject *last_name = PyIter_Next(backwards);
    Py_DECREF(backwards);
    if (last_name == NULL) return 0;
    int same = last_name == fast.last_name && PyDict_GetItemWithError(fast.modules, last_name) == fast.last_module;
    Py_DECREF(last_name);
    return same;
}

static int globals_unchanged(void) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fast.globals); i++) {
        PyObject *watched = PyTuple_GET_ITEM(fast.globals, i);
        PyObject *value = PyDict_GetItemWithError(PyTuple_GET_ITEM(watched, 0), PyTuple_GET_ITEM(watched, 1));
        if (value != PyTuple_GET_ITEM(watched, 2)) return 0;  /* also NULL: gone, or an error (cleared) */
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fast.empty); i++) {
        if (PyDict_Size(PyTuple_GET_ITEM(fast.empty, i)) != 0) return 0;
    }
    return 1;
}

/* The worker id of the DataLoader worker this fork launches, or -1: the caller of the registry's
 * `before` (the frame above it) must be multiprocessing's Popen._launch, its process_obj's target
 * the start's worker loop, its arguments positional. *popen: a new reference to the Popen. */
static long launched_worker(PyObject **popen) {
    long worker = -1;
    PyObject *back = NULL, *code = NULL, *locals = NULL, *process = NULL, *target = NULL, *args = NULL,
             *kwargs = NULL;
    *popen = NULL;
    PyFrameObject *frame = PyEval_GetFrame();  /* borrowed: the registry's _on_before */
    if (frame == NULL) goto done;
    back = (PyObject *)PyFrame_GetBack(frame);
    if (back == NULL) goto done;
    code = (PyObject *)PyFrame_GetCode((PyFrameObject *)back);
    if (code != fast.launch_code) goto done;
    locals = PyObject_GetAttrString(back, "f_locals");
    if (locals == NULL) goto done;
    process = PyMapping_GetItemString(locals, "process_obj");
    *popen = PyMapping_GetItemString(locals, "self");
    if (process == NULL || *popen == NULL) goto done;
    target = PyObject_GetAttrString(process, "_target");
    if (target != fast.target) goto done;
    args = PyObject_GetAttrString(process, "_args");
    kwargs = PyObject_GetAttrString(process, "_kwargs");
    if (args == NULL || !PyTuple_Check(args) || kwargs == NULL || PyObject_Length(kwargs) != 0) goto done;
    Py_ssize_t count = PyTuple_GET_SIZE(args);
    if (count < fast.min_args || count > fast.max_args || fast.worker_index >= count || fast.workers_index >= count)
        goto done;
    long workers = PyLong_AsLong(PyTuple_GET_ITEM(args, fast.workers_index));
    long id = PyLong_AsLong(PyTuple_GET_ITEM(args, fast.worker_index));
    if (workers != fast.num_workers || id < 0 || id >= workers || PyErr_Occurred()) goto done;
    worker = id;
done:
    Py_XDECREF(back);
    Py_XDECREF(code);
    Py_XDECREF(locals);
    Py_XDECREF(process);
    Py_XDECREF(target);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    if (worker < 0) Py_CLEAR(*popen);
    return worker;
}

/* fast_fork_before() -> bool, called first by the registry's `before`: True when this fork took
 * the fast path (the registry then returns at once), False when the Python path must run. */
PyObject *sl_fast_fork_before(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    if (!armed_here() || fast.python_open || fast.pid != getpid()) Py_RETURN_FALSE;
    fast.in_fork = 0;  /* an earlier fast fork whose after_in_parent was cut short: only gc to resume */
    resume_gc();
    PyObject *popen = NULL;
    long worker = -1;
    if (!globals_unchanged() || PyGC_IsEnabled() != fast.gc_enabled || !modules_unchanged()) goto python;
    /* The loader's lock: no Python thread holds it in a section (none runs with the GIL released:
     * checked above, and the GIL is held), and a native thread holds it only briefly. */
    unsigned long long adds, subs;
    if (!sl_loaded_counters(&adds, &subs) || adds != fast.adds || subs != fast.subs) goto python;
    if (sl_threads_within(fast.thread_ids) != 1) goto python;
    if (fast.kinds_mask != 0) {
        /* Any one kind of the mask is enough to refuse: the listing stops at the first. */
        long kinds = sl_descriptor_kinds(fast.kinds_mask, 1);
        if (kinds < 0 || (kinds & fast.kinds_mask)) goto python;
    }
    worker = launched_worker(&popen);
    if (worker < 0) goto python;
    Py_ssize_t slot = worker * fast.clock_stride + fast.clock_offset;
    if (fast.clock.buf != NULL && (slot + 1) * (Py_ssize_t)sizeof(double) > fast.clock.len) goto python;
    if (PyList_Append(fast.launches, popen) < 0) goto python;
    Py_DECREF(popen);
    if (fast.clock.buf != NULL) ((double *)fast.clock.buf)[slot] = monotonic();
    if (fast.pause_gc) {
        PyGC_Disable();  /* no Python runs: no collection can come between this and the fork */
        fast.gc_paused = 1;
    }
    fast.forks++;
    fast.worker_id = worker;
    fast.in_fork = 1;
    Py_RETURN_TRUE;
python:
    Py_XDECREF(popen);
    PyErr_Clear();
    Py_RETURN_FALSE;
}

/* fast_fork_after_in_parent() -> bool: True when the fork now ending took the fast path. */
PyObject *sl_fast_fork_after_in_parent(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    if (fast.in_fork && armed_here()) {
        fast.in_fork = 0;
        resume_gc();
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* fast_fork_in_child() -> (worker_id, num_workers) in the worker of a fast fork, else None. */
PyObject *sl_fast_fork_in_child(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    if (!child.in_fork) Py_RETURN_NONE;
    child.in_fork = 0;
    return Py_BuildValue("(ll)", child.worker_id, child.num_workers);
}

/* fast_fork_python_fork(open): the registry's Python path starts (True) or ends (False) a fork on
 * this thread; no fast path meanwhile (a fork whose after_in_parent was cut short is closed by
 * the next fork's Python path). */
PyObject *sl_fast_fork_python_fork(PyObject *Py_UNUSED(self), PyObject *open) {
    int value = PyObject_IsTrue(open);
    if (value < 0) return NULL;
    if (armed_here()) {
        if (value) resume_gc();
        fast.python_open = value;
    }
    Py_RETURN_NONE;
}

/* fast_fork_disarm() -> int: on the thread that armed it, forget the state; the number of
 * forks that took the fast path since it was armed (0 elsewhere). */
PyObject *sl_fast_fork_disarm(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused)) {
    long forks = 0;
    if (armed_here()) {
        forks = fast.forks;
        clear();
    }
    return PyLong_FromLong(forks);
}

/* fast_fork_arm(thread_ids, counters, modules_state, globals, empty, kinds_mask, launch_code, target,
 *               positions, num_workers, launches, clock, gc_state) -> bool
 * thread_ids: sorted tuple; counters: (adds, subs); modules_state: (size, last name, last module);
 * globals: ((dict, key, object), ...); empty: (dict, ...); positions: (worker index, workers index,
 * fewest, most arguments); clock: (writable buffer of doubles, stride, offset) or None;
 * gc_state: (gc enabled between forks, whether each fork pauses it).
 * False where the fast path cannot be used here (a free-threaded Python). */
PyObject *sl_fast_fork_arm(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *thread_ids, *modules_state, *globals, *empty, *launch_code, *target, *launches, *clock;
    unsigned long long adds, subs;
    Py_ssize_t worker_index, workers_index, min_args, max_args;
    long num_workers, kinds_mask;
    int gc_enabled, pause_gc;
    if (!PyArg_ParseTuple(args, "O!(KK)O!O!O!lOO(nnnn)lO!O(pp):fast_fork_arm", &PyTuple_Type, &thread_ids, &adds,
                          &subs, &PyTuple_Type, &modules_state, &PyTuple_Type, &globals, &PyTuple_Type, &empty,
                          &kinds_mask, &launch_code, &target, &worker_index, &workers_index, &min_args,
                          &max_args, &num_workers, &PyList_Type, &launches, &clock, &gc_enabled, &pause_gc))
        return NULL;
#ifdef Py_GIL_DISABLED
    Py_RETURN_FALSE;
#endif
    Py_ssize_t modules_size;
    PyObject *last_name, *last_module;
    if (!PyArg_ParseTuple(modules_state, "nOO:fast_fork_arm modules_state", &modules_size, &last_name, &last_module))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(globals); i++) {
        PyObject *watched = PyTuple_GET_ITEM(globals, i);
        if (!PyTuple_Check(watched) || PyTuple_GET_SIZE(watched) != 3 || !PyDict_Check(PyTuple_GET_ITEM(watched, 0))) {
            PyErr_SetString(PyExc_TypeError, "fast_fork_arm: globals must be (dict, key, object) tuples");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(empty); i++) {
        if (!PyDict_Check(PyTuple_GET_ITEM(empty, i))) {
            PyErr_SetString(PyExc_TypeError, "fast_fork_arm: empty must be a tuple of dicts");
            return NULL;
        }
    }
    PyObject *modules = PySys_GetObject("modules");  /* borrowed */
    if (modules == NULL || !PyDict_Check(modules)) {
        PyErr_SetString(PyExc_RuntimeError, "fast_fork_arm: sys.modules is not a dict");
        return NULL;
    }
    PyObject *reversed_name = PyUnicode_InternFromString("__reversed__");
    if (reversed_name == NULL) return NULL;
    Py_buffer buffer = {0};
    Py_ssize_t stride = 0, offset = 0;
    if (clock != Py_None) {
        PyObject *slots;
        if (!PyArg_ParseTuple(clock, "Onn:fast_fork_arm clock", &slots, &stride, &offset)
            || PyObject_GetBuffer(slots, &buffer, PyBUF_WRITABLE) < 0) {
            Py_DECREF(reversed_name);
            return NULL;
        }
    }
    if (fast.armed && fast.thread != PyThread_get_thread_ident() && fast.in_fork) {
        /* another thread's fast fork is under way (its after_in_parent to come): leave it */
        if (buffer.buf != NULL) PyBuffer_Release(&buffer);
        Py_DECREF(reversed_name);
        Py_RETURN_FALSE;
    }
    clear();
    fast.interp = PyInterpreterState_Get();
    fast.thread = PyThread_get_thread_ident();
    fast.pid = getpid();
    fast.thread_ids = Py_NewRef(thread_ids);
    fast.adds = adds;
    fast.subs = subs;
    fast.modules = Py_NewRef(modules);
    fast.modules_size = modules_size;
    fast.last_name = Py_NewRef(last_name);
    fast.last_module = Py_NewRef(last_module);
    fast.reversed_name = reversed_name;
    fast.globals = Py_NewRef(globals);
    fast.empty = Py_NewRef(empty);
    fast.gc_enabled = gc_enabled;
    fast.pause_gc = pause_gc && gc_enabled;
    fast.kinds_mask = kinds_mask;
    fast.launch_code = Py_NewRef(launch_code);
    fast.target = Py_NewRef(target);
    fast.worker_index = worker_index;
    fast.workers_index = workers_index;
    fast.min_args = min_args;
    fast.max_args = max_args;
    fast.num_workers = num_workers;
    fast.launches = Py_NewRef(launches);
    fast.clock = buffer;
    fast.clock_stride = stride;
    fast.clock_offset = offset;
    fast.armed = 1;
    Py_RETURN_TRUE;
}
