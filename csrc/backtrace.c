/*
 * Signal-safe native backtraces, for the stall watchdog.
 *
 * A worker installs the handler once (install_backtrace_handler); when its
 * parent suspects a stall it sends the signal to each thread of the worker in
 * turn (signal_thread = tgkill), and each thread writes its own backtrace to
 * the file descriptor given at install time, then an end marker.
 *
 * What the handler does is chosen to be usable in a signal handler:
 * - backtrace(): not async-signal-safe on its *first* call only (it loads
 *   libgcc_s with malloc); sl_warm_backtrace makes that call once per process
 *   tree: the parent makes it before forking workers, and each worker
 *   inherits it done (making it again in each worker would write pages the
 *   unwinder shares with the parent: about 30 copied pages per worker).
 * - dladdr(): names the shared library and nearest dynamic symbol of each
 *   frame without allocating. It takes the dynamic linker's lock, so a thread
 *   interrupted inside dlopen could block here: the parent waits for each
 *   thread's end marker with a deadline and then moves on.
 * - formatting is done by hand into a stack buffer (no printf), written with
 *   write(2), which is async-signal-safe.
 * - the only shared variables, output_fd and the kept handlers' table, are
 *   lock-free atomics, so any thread may install while another thread's handler
 *   runs (see _native.c on free-threaded Python).
 * - errno is saved on entry and restored on return: the interrupted code may be
 *   between a call that set errno and the check of it (libzmq sets EINTR, then
 *   loops while errno == EINTR). faulthandler's handler for a user signal does
 *   not restore it (CPython restores errno only with chain=True), and its writes
 *   leave errno = 0: a library then takes its failed call for a success (pyzmq's
 *   recv returns an empty message) or fails an assertion (libzmq's
 *   "errno == EAGAIN", an abort). sl_keep_errno wraps such a handler in one that
 *   restores errno.
 * Addresses are handled as uintptr_t (the integer type that holds a pointer),
 * never as long.
 */
#define _GNU_SOURCE
#include "backtrace.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Deepest stack reported, in frames: deep enough for Python's eval loop under
 * a native library; deeper stacks are cut (1 KiB of the handler's stack). */
#define MAX_FRAMES 128
/* One output line: a frame's address, library path and symbol. Longer lines
 * are truncated; paths and mangled symbols rarely reach 1 KiB. */
#define LINE_MAX_LEN 1024
/* backtrace() returns these frames before the interrupted code: frame 0 is
 * on_backtrace_signal, frame 1 the kernel's signal trampoline. */
#define HANDLER_FRAMES 2
/* Frames asked of the warm-up backtrace() call: any number >= 1 loads libgcc_s. */
#define WARMUP_FRAMES 1
/* A thread's name as /proc/<pid>/task/<tid>/comm gives it: the kernel keeps at
 * most TASK_COMM_LEN = 16 bytes (15 characters and a NUL); twice that leaves
 * room for the trailing newline and for kernels that report longer names
 * (these are cut). */
#define THREAD_NAME_MAX 32
/* Digits of a number written in base 16: one per 4 bits. */
#define HEX_BASE 16
#define HEX_DIGITS_MAX (2 * sizeof(uintptr_t))
/* Digits of a number written in base 10: 20 for the largest 64-bit value. */
#define DEC_BASE 10
#define DEC_DIGITS_MAX 20

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "output_fd must be a lock-free atomic to be read by a signal handler");
static atomic_int output_fd = -1;

/* The handlers sl_keep_errno wrapped, by signal number (0: none), and whether each takes
 * siginfo (SA_SIGINFO): read by on_kept_signal in any thread. */
_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2, "kept handlers must be lock-free atomics to be read by a signal handler");
#define SIGNALS_MAX 65 /* Linux's _NSIG: signals 1-64 */
static _Atomic(uintptr_t) kept_handler[SIGNALS_MAX];
static atomic_int kept_siginfo[SIGNALS_MAX];

typedef void (*plain_handler_t)(int);
typedef void (*info_handler_t)(int, siginfo_t *, void *);

/* The wrapper sl_keep_errno installs: the wrapped handler, errno as it found it. */
static void on_kept_signal(int signum, siginfo_t *info, void *context) {
    int saved_errno = errno;
    uintptr_t handler = signum > 0 && signum < SIGNALS_MAX
        ? atomic_load_explicit(&kept_handler[signum], memory_order_acquire) : 0;
    if (handler != 0) {
        if (atomic_load_explicit(&kept_siginfo[signum], memory_order_relaxed)) {
            ((info_handler_t)handler)(signum, info, context);
        } else {
            ((plain_handler_t)handler)(signum);
        }
    }
    errno = saved_errno;
}

typedef struct {
    char data[LINE_MAX_LEN];
    size_t len;
} line_t;

static void put_str(line_t *line, const char *text) {
    while (*text && line->len < sizeof(line->data) - 1) line->data[line->len++] = *text++;
}

static void put_hex(line_t *line, uintptr_t value) {
    char digits[HEX_DIGITS_MAX];
    size_t count = 0;
    do {
        digits[count++] = "0123456789abcdef"[value % HEX_BASE];
        value /= HEX_BASE;
    } while (value && count < sizeof(digits));
    put_str(line, "0x");
    while (count > 0 && line->len < sizeof(line->data) - 1) line->data[line->len++] = digits[--count];
}

static void put_dec(line_t *line, long value) {
    char digits[DEC_DIGITS_MAX];
    size_t count = 0;
    /* The magnitude as unsigned: -LONG_MIN does not fit in a long. */
    unsigned long magnitude = value < 0 ? 0UL - (unsigned long)value : (unsigned long)value;
    if (value < 0) put_str(line, "-");
    do {
        digits[count++] = (char)('0' + magnitude % DEC_BASE);
        magnitude /= DEC_BASE;
    } while (magnitude && count < sizeof(digits));
    while (count > 0 && line->len < sizeof(line->data) - 1) line->data[line->len++] = digits[--count];
}

static void flush_line(int fd, line_t *line) {
    size_t done = 0;
    while (done < line->len) {
        ssize_t written = write(fd, line->data + done, line->len - done);
        if (written < 0) {
            if (errno == EINTR) continue;
            break;
        }
        done += (size_t)written;
    }
    line->len = 0;
}

/* The kernel's name for this thread (e.g. "rayon-worker", "pt_data_worker"). */
static void put_thread_name(line_t *line, long tid) {
    line_t path = {.len = 0};
    put_str(&path, "/proc/self/task/");
    put_dec(&path, tid);
    put_str(&path, "/comm");
    path.data[path.len] = '\0'; /* put_str leaves the last byte free */
    int fd = open(path.data, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char name[THREAD_NAME_MAX];
    ssize_t count = read(fd, name, sizeof(name) - 1);
    close(fd);
    if (count <= 0) return;
    if (name[count - 1] == '\n') count--;
    name[count] = '\0';
    put_str(line, name);
}

/* Where `address` lies relative to `base` (a library's load address or a symbol's). */
static uintptr_t offset_from(const void *address, const void *base) {
    return (uintptr_t)address - (uintptr_t)base;
}

static void on_backtrace_signal(int signum, siginfo_t *info, void *context) {
    (void)signum; (void)info; (void)context;
    int saved_errno = errno;
    int fd = atomic_load_explicit(&output_fd, memory_order_relaxed);
    if (fd < 0) { errno = saved_errno; return; }
    long tid = syscall(SYS_gettid);
    void *frames[MAX_FRAMES];
    int count = backtrace(frames, MAX_FRAMES);
    line_t line = {.len = 0};

    put_str(&line, "native-thread ");
    put_dec(&line, tid);
    put_str(&line, " ");
    put_thread_name(&line, tid);
    put_str(&line, "\n");
    flush_line(fd, &line);
    for (int i = HANDLER_FRAMES; i < count; i++) { /* the interrupted code's frames */
        Dl_info where;
        memset(&where, 0, sizeof(where));
        int found = dladdr(frames[i], &where);
        put_str(&line, "frame ");
        put_hex(&line, (uintptr_t)frames[i]);
        put_str(&line, " ");
        if (found && where.dli_fname != NULL && where.dli_fname[0] != '\0') {
            put_str(&line, where.dli_fname);
            put_str(&line, " ");
            put_hex(&line, offset_from(frames[i], where.dli_fbase));
        } else {
            put_str(&line, "? 0x0");
        }
        put_str(&line, " ");
        if (found && where.dli_sname != NULL) {
            put_str(&line, where.dli_sname);
            put_str(&line, "+");
            put_hex(&line, offset_from(frames[i], where.dli_saddr));
        } else {
            put_str(&line, "?");
        }
        put_str(&line, "\n");
        flush_line(fd, &line);
    }
    put_str(&line, "end-thread ");
    put_dec(&line, tid);
    put_str(&line, "\n");
    flush_line(fd, &line);
    errno = saved_errno;
}

/* Set once backtrace() was called in this process or in the parent it was forked from. */
static atomic_int backtrace_warm = 0;

void sl_warm_backtrace(void) {
    if (atomic_load_explicit(&backtrace_warm, memory_order_acquire)) return;
    void *warm[WARMUP_FRAMES];
    backtrace(warm, WARMUP_FRAMES); /* loads libgcc_s now, outside any signal handler */
    atomic_store_explicit(&backtrace_warm, 1, memory_order_release);
}

int sl_install_backtrace_handler(int signum, int fd) {
    sl_warm_backtrace();
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_backtrace_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    atomic_store_explicit(&output_fd, fd, memory_order_relaxed);
    return sigaction(signum, &action, NULL);
}

int sl_release_backtrace_handler(int signum) {
    struct sigaction current;
    if (sigaction(signum, NULL, &current) != 0) return -1;
    if (!(current.sa_flags & SA_SIGINFO) || current.sa_sigaction != on_backtrace_signal) return 0;
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    /* Only ever installed on a signal that was at SIG_DFL (see _stacks.free_signals). */
    if (sigaction(signum, &action, NULL) != 0) return -1;
    return 1;
}

int sl_keep_errno(int signum) {
    if (signum <= 0 || signum >= SIGNALS_MAX) { errno = EINVAL; return -1; }
    struct sigaction current;
    if (sigaction(signum, NULL, &current) != 0) return -1;
    int siginfo = (current.sa_flags & SA_SIGINFO) != 0;
    if (siginfo && current.sa_sigaction == on_kept_signal) return 1; /* wrapped already */
    uintptr_t handler = siginfo ? (uintptr_t)current.sa_sigaction : (uintptr_t)current.sa_handler;
    if (!siginfo && (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) return 0;
    if (handler == 0) return 0;
    atomic_store_explicit(&kept_siginfo[signum], siginfo, memory_order_relaxed);
    atomic_store_explicit(&kept_handler[signum], handler, memory_order_release);
    struct sigaction action = current; /* its mask and flags (SA_RESTART, SA_ONSTACK) kept */
    action.sa_sigaction = on_kept_signal;
    action.sa_flags = current.sa_flags | SA_SIGINFO;
    if (sigaction(signum, &action, NULL) != 0) return -1;
    return 1;
}

int sl_signal_thread(int pid, int tid, int signum) {
    return (int)syscall(SYS_tgkill, pid, tid, signum);
}
