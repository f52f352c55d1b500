"""The registry validates at registration time and keeps pthread_atfork order."""

from __future__ import annotations

import pytest

import safeloader
from safeloader import RegistrationError

from .subproc import check_python

pytestmark = pytest.mark.usefixtures("clean_registry")


def noop() -> None:
    pass


def user_names() -> list[str]:
    return [hook.name for hook in safeloader.hooks() if hook.name.startswith("t.")]


def test_register_returns_handle_listed_by_hooks():
    hook = safeloader.register_at_fork(before=noop, name="t.a")
    assert hook.name == "t.a" and hook.before is noop
    assert hook in safeloader.hooks()
    assert hook.enabled and hook.active


def test_default_name_is_qualified_name_of_first_callback():
    hook = safeloader.register_at_fork(after_in_child=noop)
    assert hook.name == f"{__name__}.noop"


def test_duplicate_name_is_refused_unless_replace():
    safeloader.register_at_fork(before=noop, name="t.dup")
    with pytest.raises(RegistrationError, match=r"already registered.*replace=True"):
        safeloader.register_at_fork(before=noop, name="t.dup")
    replacement = safeloader.register_at_fork(after_in_parent=noop, name="t.dup", replace=True)
    assert [h for h in safeloader.hooks() if h.name == "t.dup"] == [replacement]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "at least one of"),
        ({"before": 42}, "before must be callable"),
        ({"after_in_child": lambda x, y: None}, "no arguments"),
        ({"before": noop, "name": ""}, "non-empty str"),
        ({"before": noop, "first": "yes"}, "first must be a bool"),
        ({"before": noop, "first": True, "last": True}, "first or last, not both"),
        ({"before": noop, "runs_after": [3]}, "runs_after must be hook names"),
        ({"before": noop, "name": "t.self", "runs_after": "t.self"}, "cannot run after itself"),
        ({"before": noop, "requires": [3]}, "module names"),
    ],
)
def test_bad_registration_is_refused_at_registration(kwargs, message):
    with pytest.raises(RegistrationError, match=message):
        safeloader.register_at_fork(**kwargs)


def test_callbacks_with_only_default_arguments_are_accepted():
    safeloader.register_at_fork(before=lambda x=1: None, name="t.defaults")


def test_unregister_by_handle_and_by_name():
    hook = safeloader.register_at_fork(before=noop, name="t.x")
    assert safeloader.unregister(hook) is hook
    safeloader.register_at_fork(before=noop, name="t.y")
    safeloader.unregister("t.y")
    assert user_names() == []
    with pytest.raises(KeyError, match=r"no fork hook named 't\.y'"):
        safeloader.unregister("t.y")


def test_hooks_order_is_first_then_registration_then_last():
    safeloader.register_at_fork(before=noop, name="t.first")
    safeloader.register_at_fork(before=noop, name="t.second")
    safeloader.register_at_fork(before=noop, name="t.late", last=True)
    safeloader.register_at_fork(before=noop, name="t.urgent", first=True)
    safeloader.register_at_fork(before=noop, name="t.most-urgent", first=True)  # later first hooks: nearer the fork
    assert user_names() == ["t.most-urgent", "t.urgent", "t.first", "t.second", "t.late"]


def test_the_removed_priority_keyword_still_orders_hooks_with_a_deprecation_warning_naming_the_new_keywords():
    # Code written against the earlier keyword (higher priority ran first in the after_* phases).
    with pytest.warns(DeprecationWarning, match=r"priority.*deprecated.*first=True.*last=True.*runs_after") as caught:
        safeloader.register_at_fork(before=noop, name="t.early", priority=10)
    assert caught[0].filename == __file__  # points at the caller's line
    with pytest.warns(DeprecationWarning, match="priority=-5 is taken as last=True"):
        safeloader.register_at_fork(before=noop, name="t.late", priority=-5)
    with pytest.warns(DeprecationWarning, match="priority=0 is taken as neither"):
        safeloader.register_at_fork(before=noop, name="t.plain", priority=0)
    safeloader.register_at_fork(before=noop, name="t.new")
    assert user_names() == ["t.early", "t.plain", "t.new", "t.late"]
    assert safeloader.hooks()[0].name == "t.early"  # first=True: nearest the fork
    with pytest.raises(RegistrationError, match="priority must be an int"):
        safeloader.register_at_fork(before=noop, name="t.bad", priority="high")
    with pytest.raises(RegistrationError, match="not both"):
        safeloader.register_at_fork(before=noop, name="t.both", priority=1, last=True)


def test_a_hook_runs_after_the_hooks_it_names_wherever_they_are_registered():
    safeloader.register_at_fork(before=noop, name="t.reader", runs_after=("t.opener", "t.absent"))
    safeloader.register_at_fork(before=noop, name="t.other")
    safeloader.register_at_fork(before=noop, name="t.opener")
    assert user_names() == ["t.other", "t.opener", "t.reader"]  # t.absent is not registered: ignored
    builtin = [hook.name for hook in safeloader.hooks() if not hook.name.startswith("t.")]
    assert builtin.index("files") < builtin.index("lmdb") and builtin.index("h5py") < builtin.index("files")


def test_a_cycle_of_runs_after_is_refused_and_changes_nothing():
    safeloader.register_at_fork(before=noop, name="t.a", runs_after=("t.b",))
    with pytest.raises(RegistrationError, match="runs_after form a cycle"):
        safeloader.register_at_fork(before=noop, name="t.b", runs_after=("t.a",))
    assert user_names() == ["t.a"]


def test_replace_keeps_no_stale_entry_and_moves_to_end():
    safeloader.register_at_fork(before=noop, name="t.a")
    safeloader.register_at_fork(before=noop, name="t.b")
    safeloader.register_at_fork(before=noop, name="t.a", replace=True)
    assert user_names() == ["t.b", "t.a"]


def test_disable_and_enable_by_name():
    hook = safeloader.register_at_fork(before=noop, name="t.switch")
    safeloader.disable("t.switch")
    assert not hook.enabled and not hook.active
    safeloader.enable(hook)
    assert hook.enabled
    with pytest.raises(KeyError):
        safeloader.disable("t.missing")


def test_requires_makes_hook_inactive_until_module_imported():
    hook = safeloader.register_at_fork(before=noop, name="t.req", requires="module_that_does_not_exist_x")
    assert hook.requires == ("module_that_does_not_exist_x",)
    assert hook.enabled and not hook.active


def test_fork_context_is_none_outside_forks():
    assert safeloader.fork_context() is None


def test_options_validate_with_clear_messages():
    with pytest.raises(ValueError, match=r"zarrs_mode must be one of .* got 'fast'"):
        safeloader.configure(zarrs_mode="fast")
    with pytest.raises(ValueError, match=r"thread_budget must be None or an int from 1 to 1024, got 0"):
        safeloader.configure(thread_budget=0)
    with pytest.raises(
        ValueError, match=r"stall_timeout must be None \(off\) or a finite number of seconds > 0, got -1"
    ):
        safeloader.configure(stall_timeout=-1)
    with pytest.raises(TypeError, match="unknown safeloader option"):
        safeloader.configure(zarr_mode="serial")
    with pytest.raises(ValueError, match=r"got unknown 'zarr'"):
        safeloader.configure(disable_hooks=["zarr"])
    previous = safeloader.configure(thread_budget=2)
    assert safeloader.get_options().thread_budget == 2 and previous.thread_budget is None


def test_a_backend_lock_another_thread_held_at_a_plain_fork_is_new_in_the_child():
    # zarrs' setup lock is made new in every forked child through the registry's reset_in_child:
    # without it, the child of a fork taken while another thread held the lock waits forever.
    result = check_python(
        """
        import os, signal, threading
        import zarrs  # noqa: F401  (the backend's hook requires it)
        from safeloader.backends import zarrs as backend

        held, release = threading.Event(), threading.Event()

        def hold():
            with backend.BACKEND.setup_lock:
                held.set()
                release.wait()

        threading.Thread(target=hold).start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)  # a lock inherited held: killed by SIGALRM instead of waiting forever
            backend.BACKEND.forget_mode_checks()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        release.set()
        print("child exit", os.waitstatus_to_exitcode(status))
        """,
        timeout=60,
    )
    assert result.stdout.strip() == "child exit 0", result


def test_a_third_party_backend_registers_like_a_builtin_and_unregisters_whole(tmp_path):
    marker = tmp_path / "workers"
    prepared = []

    class Reopener(safeloader.Backend):
        name = "t.reopener"
        description = "reopens the library's handle in each worker"
        runs_after = ("files",)

        def before(self):  # in the parent: the worker's plan
            return f"planned for {safeloader.fork_context().worker_id}"

        def after_in_child(self, plan) -> None:  # in the worker: the plan its parent made
            with open(marker, "a") as f:
                f.write(f"{safeloader.fork_context().worker_id}:{plan.replace(' ', '_')}\n")

        def prepare_start(self, loader, options, start_method) -> None:
            prepared.append(start_method)

    hook = safeloader.register_backend(Reopener)
    assert hook.name == "t.reopener" and hook in safeloader.hooks()
    names = [h.name for h in safeloader.hooks()]
    assert names.index("files") < names.index("t.reopener")
    batches = [batch.tolist() for batch in safeloader.DataLoader(list(range(4)), batch_size=2, num_workers=2)]
    assert batches == [[0, 1], [2, 3]]
    assert sorted(marker.read_text().split()) == ["0:planned_for_0", "1:planned_for_1"] and prepared == ["fork"]
    safeloader.unregister(hook)  # the whole backend: its prepare_start no longer runs
    list(safeloader.DataLoader(list(range(4)), batch_size=2, num_workers=2))
    assert prepared == ["fork"]


@pytest.mark.parametrize("backend, message", [
    (object, r"must be a safeloader\.Backend subclass or instance, got <class 'object'>"),
    (type("NoName", (), {}), r"must be a safeloader\.Backend subclass or instance"),
])
def test_a_backend_that_is_not_one_is_refused(backend, message):
    with pytest.raises(RegistrationError, match=message):
        safeloader.register_backend(backend)


def test_a_backend_phase_that_takes_no_plan_is_refused_at_registration():
    from safeloader import Backend

    class Planless(Backend):
        name = "t.planless"
        description = "its after_in_child forgets the plan argument"

        def after_in_child(self) -> None:
            pass

    with pytest.raises(RegistrationError, match=r"after_in_child must be callable with one argument, the fork's plan"):
        safeloader.register_backend(Planless)
    assert "t.planless" not in [hook.name for hook in safeloader.hooks()]


def test_a_backend_without_a_name_is_refused():
    from safeloader import Backend

    class Nameless(Backend):
        description = "does something"

    with pytest.raises(RegistrationError, match=r"Nameless\.name must be a non-empty str"):
        safeloader.register_backend(Nameless)


class _StartPlanner(safeloader.Backend):
    """Counts its ``before`` calls in the parent; each worker writes down the plan it got."""

    name = "t.start_planner"
    description = "plans once per loader start"
    plan_per_start = True

    def __init__(self, marker) -> None:
        self.marker = marker
        self.calls = 0

    def before(self):
        self.calls += 1
        return f"plan{self.calls}"

    def after_in_child(self, plan) -> None:
        with open(self.marker, "a") as f:
            f.write(f"{safeloader.fork_context().worker_id}:{plan}\n")


def test_a_per_start_plan_is_made_at_the_first_fork_and_reused_by_the_starts_other_forks(tmp_path):
    marker = tmp_path / "workers"
    backend = _StartPlanner(marker)
    safeloader.register_backend(backend)
    for start in (1, 2):
        assert len(list(safeloader.DataLoader(list(range(8)), batch_size=2, num_workers=4))) == 4
        assert backend.calls == start  # once per start, not once per worker
    lines = sorted(marker.read_text().split())
    assert lines == sorted(f"{w}:plan{s}" for w in range(4) for s in (1, 2))


def test_a_per_start_plan_is_made_again_at_a_fork_after_an_import(tmp_path):
    # A module imported between two forks of one start may change what the plan must hold.
    marker = tmp_path / "workers"
    backend = _StartPlanner(marker)
    safeloader.register_backend(backend)

    def import_after_the_first_fork() -> None:
        if backend.calls == 1:
            import tests.children.imported_between_forks  # noqa: F401  (a new module, once)

    safeloader.register_at_fork(after_in_parent=import_after_the_first_fork, name="t.importer")
    assert len(list(safeloader.DataLoader(list(range(4)), batch_size=2, num_workers=2))) == 2
    assert backend.calls == 2
    assert sorted(marker.read_text().split()) == ["0:plan1", "1:plan2"]


@pytest.mark.parametrize("change", ["register", "disable"])
def test_a_hook_registered_or_disabled_between_two_forks_of_a_start_is_honoured_at_the_next(change, tmp_path):
    # A start's later forks run the hooks its first fork ran (Arming.start_runs) unless the
    # registrations changed in between: a hook registered then runs, one disabled then does not.
    ran = tmp_path / "ran"

    def note(what: str) -> None:
        with open(ran, "a") as f:
            f.write(f"{what} ")

    if change == "disable":
        safeloader.register_at_fork(before=lambda: note("t.late"), name="t.late")
    calls = []

    def change_after_the_first_fork() -> None:
        calls.append(1)
        if len(calls) == 1 and change == "register":
            safeloader.register_at_fork(before=lambda: note("t.late"), name="t.late")
        elif len(calls) == 1:
            safeloader.disable("t.late")

    safeloader.register_at_fork(after_in_parent=change_after_the_first_fork, name="t.changer")
    try:
        assert len(list(safeloader.DataLoader(list(range(6)), batch_size=2, num_workers=3))) == 3
    finally:
        if change == "disable":
            safeloader.enable("t.late")
    expected = {"register": ["t.late", "t.late"], "disable": ["t.late"]}[change]
    assert ran.read_text().split() == expected


def test_a_backend_whose_before_finds_nothing_to_do_runs_nothing_in_that_worker(tmp_path):
    # Backend.NOTHING_TO_DO: its after_in_child is not called in that worker, and its
    # after_in_parent gets None; the other workers get their plans as usual.
    marker = tmp_path / "workers"
    parent_got = []

    class Sometimes(safeloader.Backend):
        name = "t.sometimes"
        description = "has work only for odd workers"

        def before(self):
            worker = safeloader.fork_context().worker_id
            return f"plan{worker}" if worker % 2 else self.NOTHING_TO_DO

        def after_in_parent(self, plan) -> None:
            parent_got.append(plan)

        def after_in_child(self, plan) -> None:
            with open(marker, "a") as f:
                f.write(f"{safeloader.fork_context().worker_id}:{plan}\n")

    safeloader.register_backend(Sometimes)
    assert len(list(safeloader.DataLoader(list(range(8)), batch_size=2, num_workers=4))) == 4
    assert sorted(marker.read_text().split()) == ["1:plan1", "3:plan3"]
    assert parent_got == [None, "plan1", None, "plan3"]
    assert repr(safeloader.Backend.NOTHING_TO_DO) == "safeloader.NOTHING_TO_DO"


def test_a_worker_hook_disabled_between_two_forks_of_a_start_does_not_run_in_the_later_workers(tmp_path):
    # The workers run the hooks the start's first fork found (Arming.start_runs) only while the
    # registrations are unchanged.
    marker = tmp_path / "workers"

    def note() -> None:
        with open(marker, "a") as f:
            f.write(f"{safeloader.fork_context().worker_id} ")

    safeloader.register_at_fork(after_in_child=note, name="t.noter")
    forks = []

    def disable_after_the_first_fork() -> None:
        forks.append(1)
        if len(forks) == 1:
            safeloader.disable("t.noter")

    safeloader.register_at_fork(after_in_parent=disable_after_the_first_fork, name="t.disabler")
    try:
        assert len(list(safeloader.DataLoader(list(range(6)), batch_size=2, num_workers=3))) == 3
    finally:
        safeloader.enable("t.noter")
    assert marker.read_text().split() == ["0"]


def test_a_per_start_backend_with_after_in_parent_is_refused():
    class Undoer(safeloader.Backend):
        name = "t.undoer"
        description = "undoes its before in the parent"
        plan_per_start = True

        def after_in_parent(self, plan) -> None:
            pass

    message = r"hook 't\.undoer': per_start must be False for a hook with after_in_parent"
    with pytest.raises(RegistrationError, match=message):
        safeloader.register_backend(Undoer)


@pytest.mark.parametrize("libraries", [
    pytest.param("libzzone", id="one-name"),  # was read letter by letter: 'l' matched libc, libgomp...
    pytest.param(safeloader.Library(["libzzone"]), id="one-Library-of-a-list"),  # a list broke str.startswith
    pytest.param((name for name in ["libzzone"]), id="generator"),
    pytest.param([safeloader.Library(name for name in ["libzzone"])], id="Library-of-a-generator"),
])
def test_a_backends_libraries_are_read_once_as_the_names_given(libraries):
    from safeloader.diagnostics import native_libraries

    class Declares(safeloader.Backend):
        name = "t.declares"
        description = "declares the library it makes safe"

        def after_in_child(self, plan) -> None:
            pass

    Declares.libraries = libraries
    safeloader.register_backend(Declares)
    try:
        for _lookup in range(2):  # a generator would be empty at the second
            handled = native_libraries.known("/opt/lib/libzzone.so.1", "zz")
            assert handled is not None and handled.names == ("libzzone",) and handled.by == "t.declares"
        assert native_libraries.known("/opt/lib/libzzother.so", "zz") is None
    finally:
        native_libraries._handled.pop("t.declares", None)


@pytest.mark.parametrize("libraries, message", [
    (5, r"Declares\.libraries must be an iterable of safeloader\.Library or names, got 5"),
    ([""], r"Declares\.libraries must hold safeloader\.Library or non-empty names, got ''"),
])
def test_a_backends_bad_libraries_are_refused_when_registering(libraries, message):
    class Declares(safeloader.Backend):
        name = "t.declares"
        description = "declares the library it makes safe"
    Declares.libraries = libraries
    with pytest.raises(RegistrationError, match=message):
        safeloader.register_backend(Declares)
    with pytest.raises(TypeError, match=r"Library names must be a name or an iterable of names, got 5"):
        safeloader.Library(5)
