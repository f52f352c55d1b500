"""A KeyboardInterrupt raised in each built-in hook's parent phases, then the next starts.

For every built-in hook that runs in the parent (``before`` or ``after_in_parent``) and each
place in it (``first``: before the hook's own code, ``last``: after it), the hook is wrapped to
raise KeyboardInterrupt once there, and ``iter(loader)`` must raise exactly that exception. Then
no state of the start may be left: no frozen gc, no closed pin-memory gate, no fork guard or
thread-local fork state, no worker process; and an epoch runs from the main thread and from
another thread. Prints one line per case: ``<hook> <phase> <place>: ok`` or what went wrong.
(torch's DataLoader has no fork hooks to interrupt: the storms of ``interrupt_storm.py`` are
where it runs beside safeloader.)
"""

import dataclasses
import gc
import sys
import threading

import blosc2
import psutil

import safeloader
from safeloader import _context, _dispatch, _hooks, _loader_lock
from safeloader.backends import pin_memory, threadpools

# blosc2's hook stops live C-Blosc2 pools in `before`: the parent must get them back.
blosc2.set_nthreads(2)
blosc2.decompress(blosc2.compress(bytes(1 << 20)))  # the global context's 2-thread pool runs

loader = safeloader.DataLoader(list(range(8)), batch_size=2, num_workers=2, freeze_gc=True)
list(loader)  # the pin-memory gate is in place, every lazy set-up done


class Interrupter:
    def __init__(self, original, place):
        self.original, self.place, self.fired = original, place, False

    def __call__(self, *plan):  # a backend's after_* phases get the fork's plan
        if self.place == "last":
            result = self.original(*plan)  # lost with the interrupt: the plan is what `before` set early, if any
            if not self.fired:
                self.fired = True
                raise KeyboardInterrupt("in last")
            return result
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt("in first")
        return self.original(*plan)


def epoch_in_thread():
    done = []
    thread = threading.Thread(target=lambda: done.append(len(list(loader))), daemon=True)
    thread.start()
    thread.join(15)
    return done[0] if done else "hung"


def guard_free():
    # No thread is still counted as forking (a later fork would wait for nothing, but a
    # count left behind would make _loader_lock keep the GIL in every section).
    return _loader_lock.idle()


def workers_alive():
    return [p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE
            and "resource_tracker" not in " ".join(p.cmdline())]


cases = [(hook, phase, place) for hook in safeloader.hooks() if hook.active
         for phase in ("before", "after_in_parent") if getattr(hook, phase) is not None
         for place in ("first", "last")]
print(f"{len(cases)} cases: {sorted({hook.name for hook, _, _ in cases})}", flush=True)
failures = 0
for hook, phase, place in cases:
    interrupter = Interrupter(getattr(hook, phase), place)
    _hooks._hooks[hook.name] = dataclasses.replace(hook, **{phase: interrupter})
    _hooks._reorder()
    problems = []
    try:
        iterator = iter(loader)
        problems.append("no exception")
        del iterator
    except KeyboardInterrupt as error:
        if str(error) != f"in {place}":
            problems.append(f"another KeyboardInterrupt: {error!r}")
    except BaseException as error:  # what the user must not get
        problems.append(f"{type(error).__name__}: {error}")
    finally:
        _hooks._hooks[hook.name] = hook
        _hooks._reorder()
    if not interrupter.fired:
        problems.append("the hook did not run")
    gc.collect()
    if gc.get_freeze_count():
        problems.append(f"gc left frozen ({gc.get_freeze_count()} objects)")
    gate = pin_memory.BACKEND.gate
    if gate.closers:
        problems.append(f"pin-memory gate left closed: {gate.closers}")
    if gate.lock.locked():
        problems.append("pin-memory gate's lock left held")
    if _context.armed() is not None or _dispatch._fork_left_open():
        problems.append("the registry's fork state left behind")
    if _context.plan_of(threadpools.NAME) is not None:
        problems.append("threadpools' plan left behind")
    if not guard_free():
        problems.append("fork guard left held")
    if blosc2.set_nthreads(2) != 2:  # returns the threads it had
        problems.append("blosc2's pool left at 1 thread")
    alive = workers_alive()
    if alive:
        problems.append(f"workers left running: {alive}")
    main = len(list(loader))
    other = epoch_in_thread()
    if (main, other) != (4, 4):
        problems.append(f"next epochs: main thread {main}, other thread {other}")
    failures += bool(problems)
    print(f"{hook.name} {phase} {place}: {'; '.join(problems) or 'ok'}", flush=True)
sys.exit(1 if failures else 0)
