/* A library that sets its own OpenMP thread count on every call, as LightGBM's predict does with
 * its num_threads (n_jobs) argument: omp_set_num_threads(threads), then a parallel region. A
 * thread limit set once in a DataLoader worker does not hold against it. Built by the tests
 * (tests/test_openmp_release.py) with -fopenmp, linked to a GNU OpenMP copy of their choosing. */
#include <omp.h>

/* The sum of i * i for i < n, computed by a team of `threads`; *team gets the team's size. */
long sum_squares(int threads, long n, int *team) {
    long total = 0;
    int size = 0;
    omp_set_num_threads(threads);
#pragma omp parallel reduction(+ : total)
    {
#pragma omp single
        size = omp_get_num_threads();
#pragma omp for
        for (long i = 0; i < n; i++) total += i * i;
    }
    *team = size;
    return total;
}
