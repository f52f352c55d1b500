/*
 * A loop that sets errno and reads it back, as a library does between a failed call and its
 * check of errno (libzmq: errno = EINTR, then "while (errno == EINTR)"): a signal handler that
 * runs in between and leaves errno changed is counted. tests/test_spin_samples.py builds it.
 */
#include <errno.h>

/* Rounds, out of `rounds`, whose errno read back was not the EINTR just set. */
long errno_changes(long rounds) {
    long changed = 0;
    volatile int *where = &errno; /* volatile: each round stores and loads it, none is elided */
    for (long i = 0; i < rounds; i++) {
        *where = EINTR;
        for (volatile int spin = 0; spin < 50; spin++) {
        }
        if (*where != EINTR) changed++;
    }
    return changed;
}
