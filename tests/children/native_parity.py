"""The C extension and its pure-Python fallback, side by side in one fresh interpreter.

argv: the check. Each prints what the test compares (``ok`` once its own asserts pass).
  thread_ids            both list the same threads, 3 of them started here
  threads_within        both say whether every thread now is in an earlier list (one started since: no;
                        one ended since: yes); a list of more than one directory read (200 threads)
  descriptor_table      both describe the same descriptors (a socket, a pipe, a file)
  regular_file_offsets  both give the same offsets, and skip what cannot seek
  descriptor_kinds      both see each kind appear as it is opened (a file written, a unix and a TCP
                        socket, a file read), also when asked for some kinds only: prints the bitmasks
                        in order
  file_records          both record the same regular files (only the read-only ones when asked), at
                        their offsets; file_offsets: both give each record its descriptor's offset now
  privatize_files       in a fork each, both give the same descriptors their own description at the
                        recorded offset and skip the same ones (writable, locked, /proc, asked to skip);
                        with no descriptor left, both report each as failed; by path where it still
                        names the file, else (another file, a FIFO) as without; exclusively_locked: both
                        find the locked one; without check_locks, a record naming another file is
                        skipped: prints "ok"
  privatize_files also: with a start's shared lock states, each lock read once and stored (one found
                        locked elsewhere skipped unread); records without identity taken as the file at the fork
  lock_reader           the C extension's lock reader reads each lock into the shared states, unseen by
                        thread_ids/threads_within while it runs, none of its descriptors in a child forked
                        meanwhile, stopped in the child as a no-op; the fallback starts none: prints "ok"
  fork_generation       both count two nested os.fork()s: prints the sorted lines the children wrote
  libc_fork             libc's fork() called directly, nested: prints the sorted lines the children wrote
"""

import ctypes
import fcntl
import os
import resource
import socket
import stat
import struct
import sys
import tempfile
import threading
import time

from safeloader import _native, _native_fallback


def thread_ids():
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in threads:
        t.start()
    a, b = _native.thread_ids(), _native_fallback.thread_ids()
    stop.set()
    for t in threads:
        t.join()
    assert a == b, (a, b)
    assert len(a) == 4 and set(t.native_id for t in threads) < set(a), a
    print("ok")


def threads_within():
    def check(known, expected):
        for impl in (_native, _native_fallback):
            assert impl.threads_within(known) is expected, (impl.__name__, known, expected)

    before = tuple(_native.thread_ids())
    check(before, True)
    check((), False)
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(200)]  # more than one getdents64 buffer
    for t in threads:
        t.start()
    check(before, False)  # threads started since
    during = tuple(_native.thread_ids())
    check(during, True)
    check(during[:-1], False)  # one missing from the list, wherever it lies in the listing
    check(during[1:], False)
    stop.set()
    for t in threads:
        t.join()
    check(during, True)  # threads that ended since do not count
    deadline = time.monotonic() + 10
    while tuple(_native.thread_ids()) != before:  # join() returns a moment before the thread is gone
        assert time.monotonic() < deadline, _native.thread_ids()
        time.sleep(0.01)
    check(before, True)
    for impl in (_native, _native_fallback):
        try:
            impl.threads_within(list(before))
        except TypeError as exc:
            assert impl is _native and "known must be a tuple, got list" in str(exc), exc
        else:
            assert impl is _native_fallback, "the extension takes a tuple only"
    print("ok")


def descriptor_table():
    listener = socket.socket()
    f = open(sys.executable, "rb")
    r, _w = os.pipe()
    a, b = _native.descriptor_table(), _native_fallback.descriptor_table()
    assert a == b, (a, b)
    table = {fd: (mode, dev, ino) for fd, mode, dev, ino in a}
    assert stat.S_ISSOCK(table[listener.fileno()][0]) and stat.S_ISFIFO(table[r][0]), table
    st = os.fstat(f.fileno())
    assert table[f.fileno()] == (st.st_mode, st.st_dev, st.st_ino), table
    assert sorted(table) == sorted(int(n) for n in os.listdir("/proc/self/fd") if int(n) in table), table
    print("ok")


def regular_file_offsets():
    f = open(sys.executable, "rb")
    f.read(1000)
    r, w = os.pipe()
    a, b = _native.regular_file_offsets(), _native_fallback.regular_file_offsets()
    assert a == b, (a, b)
    found = {fd: (dev, ino, offset) for fd, dev, ino, offset in a}
    st = os.fstat(f.fileno())
    assert found[f.fileno()] == (st.st_dev, st.st_ino, os.lseek(f.fileno(), 0, os.SEEK_CUR)), found
    assert r not in found and w not in found, found
    print("ok")


def descriptor_kinds():
    import tempfile

    def kinds():
        a, b = _native.descriptor_kinds(), _native_fallback.descriptor_kinds()
        assert a == b, (a, b)
        for until in range(8):  # a listing that stops once it has seen each kind asked: the same answer
            found = (_native.descriptor_kinds(until), _native_fallback.descriptor_kinds(until))
            assert found[0] & until == found[1] & until == a & until, (until, found, a)
        return a

    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a character device: no kind (stdout and stderr are the test's pipes)
    os.close(devnull)
    seen = [kinds()]
    written = tempfile.TemporaryFile()  # a regular file open for reading and writing
    seen.append(kinds())
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    seen.append(kinds())
    tcp = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET)  # not connected: still TCP
    seen.append(kinds())
    path = os.open(sys.executable, os.O_RDONLY | os.O_PATH)  # O_PATH: no file to read
    seen.append(kinds())
    read = open(sys.executable, "rb")
    seen.append(kinds())
    for f in (written, unix, udp, tcp, read):
        f.close()
    os.close(path)
    seen.append(kinds())
    # A dense table of more than 1,024 descriptors is probed number by number (where the kernel gives
    # /proc/self/fd's size, the count open: Linux 6.2+), not listed: the same kinds, a TCP socket
    # above the files and one a unix socket left below them included.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= 1400:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400), hard))
        read = open(sys.executable, "rb")
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        many = [os.dup(read.fileno()) for _ in range(1100)]
        assert kinds() == 3 and _native.descriptor_kinds(4) == 0, os.stat("/proc/self/fd").st_size
        tcp = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET)
        assert tcp.fileno() > max(many) and kinds() == 7 and _native.descriptor_kinds(4) == 4
        for fd in many:
            os.close(fd)
        for f in (read, unix, tcp):
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(" ".join(map(str, seen)))


RECORD = struct.Struct("=qQQq")


def _records(records):
    return {fd: (dev, ino, offset) for fd, dev, ino, offset in RECORD.iter_unpack(records)}


def file_records():
    read = open(sys.executable, "rb")
    read.seek(1000)
    written = tempfile.TemporaryFile()
    written.write(b"x" * 10)
    r, w = os.pipe()
    for fds in (None, (read.fileno(), written.fileno(), r, w, 10_000)):
        for read_only in (False, True):
            a, b = _native.file_records(fds, read_only), _native_fallback.file_records(fds, read_only)
            assert a == b, (fds, read_only, _records(a), _records(b))
            found = _records(a)
            st = os.fstat(read.fileno())
            assert found[read.fileno()] == (st.st_dev, st.st_ino, 1000), found
            assert (written.fileno() in found) is not read_only and r not in found and w not in found, found
    for impl in (_native, _native_fallback):
        try:
            impl.file_records([read.fileno()], True)
        except TypeError as exc:
            assert "fds must be a tuple or None" in str(exc), exc
        else:
            raise AssertionError(f"{impl.__name__} took a list")
    # file_offsets: the same records with each descriptor's offset now (-1: closed, or cannot seek),
    # the identities as given (a made-up one kept: the worker compares it).
    records = _native.file_records((read.fileno(), written.fileno()), False)
    records += RECORD.pack(r, 1, 2, 0) + RECORD.pack(10_000, 3, 4, 5) + RECORD.pack(written.fileno(), 5, 6, 7)
    read.seek(2000)
    a, b = _native.file_offsets(records), _native_fallback.file_offsets(records)
    assert a == b, (list(RECORD.iter_unpack(a)), list(RECORD.iter_unpack(b)))
    st = os.fstat(read.fileno())
    assert next(RECORD.iter_unpack(a)) == (read.fileno(), st.st_dev, st.st_ino, 2000), a
    at = os.lseek(written.fileno(), 0, os.SEEK_CUR)
    assert [offset for _, _, _, offset in RECORD.iter_unpack(a)][1:] == [at, -1, -1, at], a
    assert [(dev, ino) for _, dev, ino, _ in RECORD.iter_unpack(a)][2:] == [(1, 2), (3, 4), (5, 6)], a
    for impl in (_native, _native_fallback):
        try:
            impl.file_offsets(records[:-1])
        except ValueError as exc:
            assert "file_records' bytes" in str(exc), exc
        else:
            raise AssertionError(f"{impl.__name__} took a cut record")
    print("ok")


def _privatize_in_a_fork(impl, records, skip, virtual, files, limit=None, check_locks=True, paths=(),
                         lock_states=None, first=0):
    """What ``impl.privatize_files`` did in a forked child, as a printable tuple."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            if limit is not None:  # no descriptor left: every reopen fails with EMFILE
                _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (max(files.values()) + 64, hard))
                while True:
                    try:
                        os.open(os.devnull, os.O_RDONLY)
                    except OSError:
                        break
            privatized, failed = impl.privatize_files(records, skip, virtual, check_locks, paths, lock_states, first)
            # A private description: moving its offset leaves the parent's (and the siblings') alone.
            offsets = {name: os.lseek(fd, 0, os.SEEK_CUR) for name, fd in files.items()}
            for fd in files.values():
                os.lseek(fd, 3, os.SEEK_CUR)
            flags = {name: (fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_ACCMODE | os.O_NONBLOCK),
                            fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC) for name, fd in files.items()}
            names = {fd: name for name, fd in files.items()}
            read = {name: os.pread(fd, 2, 0) for name, fd in files.items() if name != "writable"}
            report = (sorted(names[fd] for fd in privatized), sorted((names[fd], code) for fd, code in failed),
                      offsets, flags, read)
            os.write(w, repr(report).encode())
        finally:
            os._exit(0)
    os.close(w)
    report = b""
    while chunk := os.read(r, 65536):
        report += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return report.decode()


def privatize_files():
    import errno

    directory = tempfile.mkdtemp()

    def path(name):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(name.encode() * 200)
        return os.path.join(directory, name)

    files = {
        "at_50": os.open(path("a"), os.O_RDONLY),
        "moved_since": os.open(path("b"), os.O_RDONLY | os.O_NONBLOCK),  # recorded as another file: read now
        "inheritable": os.open(path("c"), os.O_RDONLY),
        "asked_to_skip": os.open(path("d"), os.O_RDONLY),
        "writable": os.open(path("e"), os.O_RDWR),
        "locked": os.open(path("f"), os.O_RDONLY),
        "shared_lock": os.open(path("g"), os.O_RDONLY),
        "virtual": os.open("/proc/self/status", os.O_RDONLY),
        "replaced": os.open(path("h"), os.O_RDONLY),
    }
    os.rename(path("h"), os.path.join(directory, "h.old"))
    path("h")  # another file at the path since
    fifo = os.path.join(directory, "fifo")
    os.mkfifo(fifo)
    # Reopened by path: where it names the file (at_50, moved_since, locked); not where it names another
    # file (inheritable, replaced) or a FIFO (shared_lock: opened non-blocking, so no hang): /proc/self/fd.
    paths = tuple(sorted((files[name], os.fsencode(os.path.join(directory, at))) for name, at in (
        ("at_50", "a"), ("moved_since", "b"), ("locked", "f"), ("inheritable", "d"), ("replaced", "h"),
        ("shared_lock", fifo))))
    os.set_inheritable(files["inheritable"], True)
    os.lseek(files["at_50"], 50, os.SEEK_SET)
    os.lseek(files["moved_since"], 20, os.SEEK_SET)
    fcntl.flock(files["locked"], fcntl.LOCK_EX)
    fcntl.flock(files["shared_lock"], fcntl.LOCK_SH)
    records = _native.file_records(tuple(files.values()), False)
    assert records == _native_fallback.file_records(tuple(files.values()), False)
    found = _records(records)
    found[files["moved_since"]] = (found[files["moved_since"]][0], 1, 7)  # another inode recorded: not its offset
    os.lseek(files["at_50"], 60, os.SEEK_SET)  # the parent moved on since the record: the worker starts at 50
    records = b"".join(RECORD.pack(fd, *found[fd]) for fd in sorted(found))
    virtual = (os.stat("/proc").st_dev,)
    skip = (files["asked_to_skip"],)
    a = _privatize_in_a_fork(_native, records, skip, virtual, files)
    for name in ("asked_to_skip", "writable", "locked", "virtual"):  # shared: moved by the worker
        os.lseek(files[name], 0, os.SEEK_SET)
    b = _privatize_in_a_fork(_native_fallback, records, skip, virtual, files)
    assert a == b, (a, b)
    privatized, failed, offsets, flags, read = eval(a)
    assert privatized == ["at_50", "inheritable", "moved_since", "replaced", "shared_lock"] and failed == [], a
    assert read["replaced"] == b"hh" and read["inheritable"] == b"cc", a  # the inherited files, not the paths'
    reset = {name: os.lseek(files[name], 0, os.SEEK_CUR) for name in ("asked_to_skip", "writable", "locked", "virtual")}
    for name in reset:
        os.lseek(files[name], 0, os.SEEK_SET)
    by_path = _privatize_in_a_fork(_native, records, skip, virtual, files, paths=paths)
    for name in reset:
        os.lseek(files[name], 0, os.SEEK_SET)
    assert by_path == _privatize_in_a_fork(_native_fallback, records, skip, virtual, files, paths=paths)
    assert by_path == a, (by_path, a)  # the same files, offsets, flags and bytes, whichever way reopened
    for name, offset in reset.items():
        os.lseek(files[name], offset, os.SEEK_SET)
    assert offsets["at_50"] == 50 and offsets["moved_since"] == 20 and offsets["inheritable"] == 0, a
    assert flags["moved_since"] == (os.O_RDONLY | os.O_NONBLOCK, 1), a
    assert flags["inheritable"] == (os.O_RDONLY, 0) and flags["at_50"] == (os.O_RDONLY, 1), a
    # The parent's offsets did not move with the private descriptions'; the shared ones did.
    assert os.lseek(files["at_50"], 0, os.SEEK_CUR) == 60 and os.lseek(files["moved_since"], 0, os.SEEK_CUR) == 20
    assert os.lseek(files["asked_to_skip"], 0, os.SEEK_CUR) == 3 and os.lseek(files["locked"], 0, os.SEEK_CUR) == 3
    before = {fd: os.lseek(fd, 0, os.SEEK_CUR) for fd in files.values()}
    a = _privatize_in_a_fork(_native, records, skip, virtual, files, limit=True)
    for fd, offset in before.items():  # all shared: moved by the worker
        os.lseek(fd, offset, os.SEEK_SET)
    b = _privatize_in_a_fork(_native_fallback, records, skip, virtual, files, limit=True)
    assert a == b, (a, b)
    privatized, failed, offsets, flags, read = eval(a)
    # The lock cannot be read either (no descriptor for /proc/self/fdinfo): tried as if unlocked.
    assert privatized == [] and failed == [
        (name, errno.EMFILE) for name in ("at_50", "inheritable", "locked", "moved_since", "replaced", "shared_lock")
    ], a
    assert offsets["at_50"] == 60, a  # still the parent's description
    assert os.lseek(files["at_50"], 0, os.SEEK_CUR) == 63  # which the worker moved
    fds = tuple(files.values())
    assert _native.exclusively_locked(fds) == _native_fallback.exclusively_locked(fds) == (files["locked"],)
    # Vetted records with their locks read through a start's shared states (a byte a record, one
    # MAP_SHARED page as the files hook makes): the locked one's read there and skipped; one a
    # sibling worker already found locked (2) is skipped unread; the others' found free (1).
    import mmap

    order = sorted(files.values())
    names = {fd: name for name, fd in files.items()}
    for impl in (_native, _native_fallback):
        for fd, offset in before.items():
            os.lseek(fd, offset, os.SEEK_SET)
        states = mmap.mmap(-1, len(order))
        states[order.index(files["inheritable"])] = 2
        report = _privatize_in_a_fork(impl, records, skip, virtual, files, check_locks=False, paths=paths,
                                      lock_states=states, first=3)
        assert eval(report)[0] == ["at_50", "replaced", "shared_lock"], (impl.__name__, report)
        found = {names[fd]: states[i] for i, fd in enumerate(order)}
        assert found == {"at_50": 1, "moved_since": 0, "inheritable": 2, "asked_to_skip": 0, "writable": 0,
                         "locked": 2, "shared_lock": 1, "virtual": 0, "replaced": 1}, (impl.__name__, found)
        # Records without identity (0, 0: a loader's held descriptors, not looked at in the parent):
        # each taken as the file its descriptor names at the fork, moved_since among them.
        unrecorded = b"".join(RECORD.pack(fd, 0, 0, offset) for fd, (_, _, offset) in sorted(_records(records).items()))
        for fd, offset in before.items():
            os.lseek(fd, offset, os.SEEK_SET)
        report = _privatize_in_a_fork(impl, unrecorded, skip, virtual, files, check_locks=False, paths=paths,
                                      lock_states=mmap.mmap(-1, len(order)))
        privatized, _, offsets, _, _ = eval(report)
        assert privatized == ["at_50", "inheritable", "moved_since", "replaced", "shared_lock"], report
        assert offsets["moved_since"] == 7, report  # its offset as recorded at the fork, not read anew (20)
        for bad, error in (((bytes(len(order)), 0), BufferError), ((mmap.mmap(-1, 2), 0), ValueError),
                           ((mmap.mmap(-1, len(order)), -1), ValueError)):
            try:
                impl.privatize_files(records, skip, virtual, False, (), *bad)
            except error as exc:
                assert "lock_states" in str(exc) or "first" in str(exc) or "writable" in str(exc), exc
            else:
                raise AssertionError(f"{impl.__name__} took lock_states/first {bad!r}")
    for fd, offset in before.items():
        os.lseek(fd, offset, os.SEEK_SET)
    a = _privatize_in_a_fork(_native, records, skip, virtual, files, check_locks=False, paths=paths)
    for fd, offset in before.items():
        os.lseek(fd, offset, os.SEEK_SET)
    b = _privatize_in_a_fork(_native_fallback, records, skip, virtual, files, check_locks=False, paths=paths)
    assert a == b, (a, b)
    # The records are the parent's vetted set: one whose descriptor names another file now (moved_since's
    # record names another inode) is left shared, not reopened as the file it names now.
    assert eval(a)[0] == ["at_50", "inheritable", "locked", "replaced", "shared_lock"], a
    for impl in (_native, _native_fallback):
        for function in (impl.exclusively_locked,):
            try:
                function(list(fds))
            except TypeError as exc:
                assert "fds must be a tuple" in str(exc), exc
            else:
                raise AssertionError(f"{impl.__name__}.{function.__name__} took a list")
        try:
            impl.privatize_files(records[:-1], (), (), True, ())
        except ValueError as exc:
            assert "file_records' bytes" in str(exc), exc
        else:
            raise AssertionError(f"{impl.__name__} took a cut record")
    print("ok")


def lock_reader():
    import mmap
    import time

    directory = tempfile.mkdtemp()
    count = 3000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 200), hard))
    fds = []
    for i in range(count):
        with open(os.path.join(directory, str(i)), "wb") as f:
            f.write(b"x")
        fds.append(os.open(os.path.join(directory, str(i)), os.O_RDONLY))
    fcntl.flock(fds[7], fcntl.LOCK_EX)
    fcntl.flock(fds[8], fcntl.LOCK_SH)
    records = bytearray(b"".join(RECORD.pack(fd, 0, 0, -1) for fd in fds))
    assert _native_fallback.read_locks_behind(records, mmap.mmap(-1, count)) is None
    _native_fallback.lock_reader_identified(None)
    _native_fallback.stop_lock_reader(None)
    tasks_before, ids_before = set(os.listdir("/proc/self/task")), _native.thread_ids()
    states = mmap.mmap(-1, count)
    reader = _native.read_locks_behind(records, states)
    assert reader is not None
    tasks, ids = set(os.listdir("/proc/self/task")), _native.thread_ids()
    _native.lock_reader_identified(reader)  # each record's identity written first
    identities = [(dev, ino) for _, dev, ino, _ in RECORD.iter_unpack(records)]
    assert identities == [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in fds], identities[:3]
    within = _native.threads_within(tuple(ids_before))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # forked while the reader runs: none of its descriptors here, and no thread to stop
        try:
            leaked = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    leaked += [fd] if "fdinfo" in os.readlink(f"/proc/self/fd/{fd}") else []
                except OSError:  # the listing's own descriptor, closed by now
                    pass
            _native.stop_lock_reader(reader)
            os.write(w, repr(leaked).encode())
        finally:
            os._exit(0)
    os.close(w)
    leaked = os.read(r, 65536).decode()
    os.close(r)
    os.waitpid(pid, 0)
    # The reader was running when looked at (else the checks below prove nothing): one more task.
    assert len(tasks - tasks_before) == 1, (tasks, tasks_before)
    assert ids == ids_before and within, (ids, ids_before, within)  # left out of the census
    assert leaked == "[]", leaked
    deadline = time.monotonic() + 30
    while set(os.listdir("/proc/self/task")) != tasks_before and time.monotonic() < deadline:
        time.sleep(0.01)
    _native.stop_lock_reader(reader)
    _native.stop_lock_reader(reader)  # a second stop does nothing
    found = bytes(states)
    assert found[7] == 2 and found[:7] + found[8:] == b"\x01" * (count - 1), found
    # Stopped early: what was not read stays 0, for the workers to read.
    states = mmap.mmap(-1, count)
    reader = _native.read_locks_behind(records, states)
    _native.stop_lock_reader(reader)
    _native.lock_reader_identified(reader)  # stopped: nothing to wait for
    assert set(os.listdir("/proc/self/task")) == tasks_before
    assert bytes(states).count(0) > 0 and set(bytes(states)) <= {0, 1, 2}, bytes(states)
    for bad, error in (((records[:-1], states), ValueError), ((records, bytes(count)), BufferError),
                       ((records, mmap.mmap(-1, 2)), ValueError), ((bytes(records), states), BufferError)):
        try:
            _native.read_locks_behind(*bad)
        except error:
            pass
        else:
            raise AssertionError(f"read_locks_behind took {bad!r:.80}")
    print("ok")


def fork_generation():
    assert _native.fork_generation() == _native_fallback.fork_generation() == 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        pid2 = os.fork()
        if pid2 == 0:
            os.write(w, f"{_native.fork_generation()} {_native_fallback.fork_generation()}\n".encode())
            os._exit(0)
        os.waitpid(pid2, 0)
        os.write(w, f"{_native.fork_generation()} {_native_fallback.fork_generation()}\n".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(w)
    print(sorted(os.read(r, 100).decode().split("\n")))
    assert _native.fork_generation() == 0


def libc_fork():
    libc = ctypes.PyDLL(None)  # PyDLL: keep the GIL held across the call
    r, w = os.pipe()
    pid = libc.fork()
    if pid == 0:
        pid2 = libc.fork()  # before the child reads either counter
        if pid2 == 0:
            os.write(w, f"{_native.fork_generation()} {_native_fallback.fork_generation()}\n".encode())
            os._exit(0)
        os.waitpid(pid2, 0)
        os.write(w, f"{_native.fork_generation()} {_native_fallback.fork_generation()}\n".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(w)
    print(sorted(os.read(r, 100).decode().split("\n")))


CHECKS = {
    f.__name__: f
    for f in (thread_ids, threads_within, descriptor_table, regular_file_offsets, descriptor_kinds, file_records,
              privatize_files, lock_reader, fork_generation, libc_fork)
}
CHECKS[sys.argv[1]]()
