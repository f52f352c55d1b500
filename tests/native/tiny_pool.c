/* A minimal C thread pool, shaped like the pools of DuckDB, blosc2 or FFmpeg: threads started
 * once, waiting on a condition variable for tasks; a caller queues a task and waits for its
 * result. A process forked after pool_start has the pool's state but none of its threads:
 * pool_square there waits forever, inside this library (tests/test_unknown_pools.py).
 * Built by the tests with the system C compiler: cc -shared -fPIC -pthread. */
#include <pthread.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER, up = PTHREAD_COND_INITIALIZER;
static long task, result;
static int pending, finished, started, ready;

static void *pool_thread(void *unused) {
    (void)unused;
    pthread_mutex_lock(&lock);
    ready++;
    pthread_cond_broadcast(&up);
    for (;;) {
        while (!pending) pthread_cond_wait(&work, &lock);
        pending = 0;
        result = task * task;
        finished = 1;
        pthread_cond_broadcast(&done);
    }
    return 0;
}

int pool_start(int threads) {
    pthread_mutex_lock(&lock);
    for (; started < threads; started++) {
        pthread_t thread;
        if (pthread_create(&thread, 0, pool_thread, 0) != 0) break;
        pthread_detach(thread);
    }
    /* Every thread inside the pool's code before returning: on a loaded machine one could
     * otherwise still be starting, not yet in this library, when the caller forks. */
    while (ready < started) pthread_cond_wait(&up, &lock);
    pthread_mutex_unlock(&lock);
    return started;
}

/* What a library's own at-fork reset does, in a child: forget the threads it does not have. */
void pool_forget_threads(void) {
    pthread_mutex_init(&lock, 0);  /* the parent's waiters are counted in these: made new */
    pthread_cond_init(&work, 0);
    pthread_cond_init(&done, 0);
    pthread_cond_init(&up, 0);
    started = 0;
    ready = 0;
    pending = 0;
}

long pool_square(long value) {
    pthread_mutex_lock(&lock);
    while (pending) pthread_cond_wait(&done, &lock);
    task = value, pending = 1, finished = 0;
    pthread_cond_signal(&work);
    while (!finished) pthread_cond_wait(&done, &lock);
    long out = result;
    pthread_mutex_unlock(&lock);
    return out;
}
