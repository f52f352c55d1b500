/* Signal-safe native backtraces for the stall watchdog: see backtrace.c. */
#ifndef SAFELOADER_BACKTRACE_H
#define SAFELOADER_BACKTRACE_H

/* Install a handler for `signum` that writes the receiving thread's backtrace
 * to `fd`. Returns 0, or -1 with errno set. */
int sl_install_backtrace_handler(int signum, int fd);

/* Put SIG_DFL back on `signum` if this module's handler is the one installed there.
 * 1 if it was, 0 if another handler is there (left alone), -1 with errno. */
int sl_release_backtrace_handler(int signum);

/* Make glibc's backtrace() load its unwinder now (it allocates: never in a
 * signal handler). Once per process, and forked children inherit it done. */
void sl_warm_backtrace(void);

/* Wrap the handler installed on `signum` (faulthandler's, say) in one that restores errno.
 * 1 if wrapped (now or before), 0 if no handler is there (SIG_DFL, SIG_IGN), -1 with errno. */
int sl_keep_errno(int signum);

/* tgkill(pid, tid, signum): signal one thread of a process. 0, or -1 with errno. */
int sl_signal_thread(int pid, int tid, int signum);

#endif
