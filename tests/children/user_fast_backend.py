"""A backend of a user's own, in a module of the user's (not under safeloader/): its plan is the
parent's pid and the fork's worker id, it records in each worker what it received, and it tells
the C path that a start's later forks need nothing of it in the parent (``fast_fork``)."""

import os

import safeloader

RECEIVED: list[dict] = []  # in a worker: what its after_in_child was handed


class StampBackend(safeloader.Backend):
    name = "user.stamp"
    description = "hands each worker the parent's pid and the worker id seen at its fork"

    def before(self, ctx):
        return {"parent": os.getpid(), "worker_at_plan": ctx.worker_id}

    def after_in_child(self, ctx, plan):
        RECEIVED.append({"ctx_worker": ctx.worker_id, "plan": plan, "parent": os.getppid()})

    def fast_fork(self, ctx, plan):
        # Later forks of the start: nothing to do in the parent; each worker gets this plan.
        return safeloader.FastFork(worker_plan=plan)
