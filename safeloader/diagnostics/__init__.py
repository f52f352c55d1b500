"""What is live in this process and what it means for a forked worker, in one place.

One table of what is known about a library (``native_libraries``, its handled rows contributed
by the backends), one attribution of native threads to the library that owns them
(``thread_owners``, ``native_pools``), and the stacks of a process (``stacks``), read by the
fork-time check (``unsafe_fork``), the stall report (``stall_report``, ``stall_causes``) and
``safeloader.doctor``.
Nothing here imports the ``doctor`` report.
"""
