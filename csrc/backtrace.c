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
 *   libgcc_s with malloc); install_backtrace_handler calls it once first.
 * - dladdr(): names the shared library and nearest dynamic symbol of each
 *   frame without allocating. It takes the dynamic linker's lock, so a thread
 *   interrupted inside dlopen could block here: the parent waits for each
 *   thread's end marker with a deadline and then moves on.
 * - formatting is done by hand into a stack buffer (no printf), written with
 *   write(2), which is async-signal-safe.
 */
#define _GNU_SOURCE
#include "backtrace.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_FRAMES 128
#define LINE_MAX_LEN 1024

static volatile sig_atomic_t output_fd = -1;

typedef struct {
    char data[LINE_MAX_LEN];
    size_t len;
} line_t;

static void put_str(line_t *line, const char *text) {
    while (*text && line->len < sizeof(line->data) - 1) line->data[line->len++] = *text++;
}

static void put_hex(line_t *line, unsigned long value) {
    char digits[2 * sizeof(value)];
    int count = 0;
    do {
        digits[count++] = "0123456789abcdef"[value & 0xf];
        value >>= 4;
    } while (value && count < (int)sizeof(digits));
    put_str(line, "0x");
    while (count > 0 && line->len < sizeof(line->data) - 1) line->data[line->len++] = digits[--count];
}

static void put_dec(line_t *line, long value) {
    char digits[24];
    int count = 0;
    if (value < 0) { put_str(line, "-"); value = -value; }
    do {
        digits[count++] = (char)('0' + value % 10);
        value /= 10;
    } while (value && count < (int)sizeof(digits));
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
    char path[64] = "/proc/self/task/";
    line_t number = {.len = 0};
    put_dec(&number, tid);
    memcpy(path + 16, number.data, number.len);
    memcpy(path + 16 + number.len, "/comm", 6);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char name[32];
    ssize_t count = read(fd, name, sizeof(name) - 1);
    close(fd);
    if (count <= 0) return;
    if (name[count - 1] == '\n') count--;
    name[count] = '\0';
    put_str(line, name);
}

static void on_backtrace_signal(int signum, siginfo_t *info, void *context) {
    (void)signum; (void)info; (void)context;
    int saved_errno = errno;
    int fd = output_fd;
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
    /* Frame 0 is this handler and frame 1 the kernel's signal trampoline:
     * the interrupted code starts at frame 2. */
    for (int i = 2; i < count; i++) {
        Dl_info where;
        memset(&where, 0, sizeof(where));
        int found = dladdr(frames[i], &where);
        put_str(&line, "frame ");
        put_hex(&line, (unsigned long)frames[i]);
        put_str(&line, " ");
        if (found && where.dli_fname != NULL && where.dli_fname[0] != '\0') {
            put_str(&line, where.dli_fname);
            put_str(&line, " ");
            put_hex(&line, (unsigned long)frames[i] - (unsigned long)where.dli_fbase);
        } else {
            put_str(&line, "? 0x0");
        }
        put_str(&line, " ");
        if (found && where.dli_sname != NULL) {
            put_str(&line, where.dli_sname);
            put_str(&line, "+");
            put_hex(&line, (unsigned long)frames[i] - (unsigned long)where.dli_saddr);
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

int sl_install_backtrace_handler(int signum, int fd) {
    void *warm[4];
    backtrace(warm, 4); /* loads libgcc_s now, outside any signal handler */
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_backtrace_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    output_fd = fd;
    return sigaction(signum, &action, NULL);
}

int sl_signal_thread(int pid, int tid, int signum) {
    return (int)syscall(SYS_tgkill, pid, tid, signum);
}
