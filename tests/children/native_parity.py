"""The C extension and its pure-Python fallback, side by side in one fresh interpreter.

argv: the check. Each prints what the test compares (``ok`` once its own asserts pass).
  thread_ids            both list the same threads, 3 of them started here
  threads_within        both say whether every thread now is in an earlier list (one started since: no;
                        one ended since: yes); a list of more than one directory read (200 threads)
  descriptor_table      both describe the same descriptors (a socket, a pipe, a file)
  regular_file_offsets  both give the same offsets, and skip what cannot seek
  descriptor_kinds      both see each kind appear as it is opened (a file written, a unix and a TCP
                        socket, a file read): prints the bitmasks in order
  fork_generation       both count two nested os.fork()s: prints the sorted lines the children wrote
  libc_fork             libc's fork() called directly, nested: prints the sorted lines the children wrote
"""

import ctypes
import os
import socket
import stat
import sys
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
    print(" ".join(map(str, seen)))


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
    for f in (thread_ids, threads_within, descriptor_table, regular_file_offsets, descriptor_kinds, fork_generation,
              libc_fork)
}
CHECKS[sys.argv[1]]()
