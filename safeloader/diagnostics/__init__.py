"""What is live in this process and what it means for a forked worker: one table of libraries
(``native_libraries``), thread attribution (``thread_owners``, ``native_pools``), stacks, read by
the fork-time check, the stall report and ``doctor`` (which nothing here imports)."""
