"""safeloader's benchmarks: side-by-side measurements reported as ratios."""
