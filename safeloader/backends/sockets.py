"""Sockets: no forked worker shares a TCP (or TLS) conversation with the parent; one-way streams stay shared
(why: docs/internals.md)."""

from __future__ import annotations

import _socket
import os
import socket
import stat
import sys
from typing import Any

from .. import native
from .._context import ForkContext
from .._hooks import FastFork
from . import _descriptors
from ._backend import Backend
from .pin_memory import NAME as PIN_MEMORY

NAME = "sockets"

# Linux TCP states (tcp_states.h) in which a socket is not a stream shared with a peer.
_TCP_CLOSE = 7
_TCP_LISTEN = 10
_INET = (socket.AF_INET, getattr(socket, "AF_INET6", socket.AF_INET))
# struct tcp_info (linux/tcp.h): tcpi_bytes_received, a u64 at bytes 128-136 (Linux 4.1+): the
# payload bytes the connection received from its peer, whoever read them.
_TCP_INFO_SIZE = 136
_BYTES_RECEIVED = slice(128, 136)

def sever_inherited_connections(stand_ins: StandIns) -> None:
    """In a worker: replace each inherited TCP conversation (a connected socket that received data)
    with a closed stand-in; note the one-way streams (connected, nothing ever received) left shared."""
    if not _descriptors.AVAILABLE:
        return
    # Listed once for this fork; the "files" hook reads the same list after this one.
    for fd, mode, _, ino in _descriptors.at_fork():
        if not stat.S_ISSOCK(mode):
            continue
        found = _connected_tcp(fd)
        if found is None:
            continue
        family, conversation = found
        if conversation:
            os.dup2(stand_ins.get(family).fileno(), fd, inheritable=os.get_inheritable(fd))
        else:
            stand_ins.kept.add(ino)
    if (stand_ins.severed_any() or stand_ins.kept) and "http.client" in sys.modules:
        _reconnect_http_client_connections()


def _connected_tcp(fd: int) -> tuple[int, bool] | None:
    """(address family, whether it ever received data) of ``fd`` if it is a TCP socket with (or
    connecting to) a peer; None for anything else."""
    try:
        # The C type: no Python-level wrapper, no enum conversions (a worker pays this per socket).
        probe = _socket.socket(fileno=fd)  # no dup: detached below, never closed
    except OSError:
        return None
    try:
        if probe.family not in _INET or probe.type != socket.SOCK_STREAM:
            return None
        try:
            info = probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
        except OSError:  # not TCP after all (MPTCP without TCP_INFO...): leave it
            return None
        if info[0] in (_TCP_CLOSE, _TCP_LISTEN):
            return None
        # A kernel too old to count (before 4.1) cannot tell a one-way stream: treated as a conversation.
        received = int.from_bytes(info[_BYTES_RECEIVED], sys.byteorder) if len(info) >= _TCP_INFO_SIZE else 1
        return probe.family, received > 0
    finally:
        probe.detach()


class StandIns:
    """A worker's closed stand-in socket of each family (kept open so that its inode, by which
    severed descriptors are recognised, is not reused), and those inodes."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._sockets: dict[int, socket.socket] = {}
        self._inodes: set[int] = set()
        self.kept: set[int] = set()
        """Inodes of the inherited one-way streams left shared (nothing received before the fork)."""

    def get(self, family: int) -> socket.socket:
        """This process's socket of ``family`` that behaves as one closed by its peer."""
        stand_in = self._sockets.get(family)
        if stand_in is None:
            stand_in = socket.socket(family, socket.SOCK_STREAM)
            try:
                # On a socket of our own that never connected, this sets the shutdown
                # flags only: reads see end-of-file, writes EPIPE, poll POLLIN|POLLHUP.
                stand_in.shutdown(socket.SHUT_RDWR)
            except OSError:  # ENOTCONN, as expected: the flags are set regardless
                pass
            self._sockets[family] = stand_in
            self._inodes.add(os.fstat(stand_in.fileno()).st_ino)
        return stand_in

    def severed_any(self) -> bool:
        return bool(self._inodes)

    def severed(self, sock: Any) -> bool:
        """Whether ``sock`` (a socket object) is one of this worker's severed descriptors."""
        return self._inode_in(sock, self._inodes)

    def shared(self, sock: Any) -> bool:
        """Whether ``sock`` is an inherited one-way stream this worker still shares with the parent."""
        return self._inode_in(sock, self.kept)

    def _inode_in(self, sock: Any, inodes: set[int]) -> bool:
        if self.pid != os.getpid() or not inodes:
            return False
        try:
            fd = sock.fileno()
            return fd >= 0 and os.fstat(fd).st_ino in inodes
        except (OSError, AttributeError, ValueError):
            return False


def _reconnect_http_client_connections() -> None:
    """Make inherited ``http.client`` connections reconnect on their next request (why: docs/internals.md)."""
    import http.client

    original = http.client.HTTPConnection.putrequest
    if getattr(original, "_safeloader_wrapped", False):
        return

    def putrequest(self: Any, *args: Any, **kwargs: Any) -> Any:
        sock = self.sock
        if sock is not None and (BACKEND.severed(sock) or BACKEND.shared(sock)):
            self.close()
        return original(self, *args, **kwargs)

    putrequest._safeloader_wrapped = True  # type: ignore[attr-defined]
    putrequest.__wrapped__ = original  # type: ignore[attr-defined]
    http.client.HTTPConnection.putrequest = putrequest  # type: ignore[method-assign]


class SocketsBackend(Backend):
    name = NAME
    description = (
        "each worker's inherited TCP/TLS connections that received data look closed by the server: clients "
        "reconnect; write-only streams stay shared"
    )
    # First among the data backends: any later hook (or library at-fork
    # handler) that closes a TLS connection must write its close_notify into
    # the stand-in, not into the parent's stream. Inside the pin-memory gate.
    first = True
    runs_after = (PIN_MEMORY,)

    def before(self, ctx: ForkContext) -> Any:
        # A socket's family and type never change (whether it is connected does: the worker checks).
        if not _descriptors.kinds_at_fork() & native.TCP_SOCKET:
            return self.NOTHING_TO_DO
        _descriptors.at_fork()  # listed in the parent, for the worker's hooks
        return None

    def __init__(self) -> None:
        self.stand_ins: StandIns | None = None
        """In a worker that severed connections: its stand-in sockets."""

    def after_in_child(self, ctx: ForkContext, plan: None) -> None:
        self.stand_ins = StandIns()
        sever_inherited_connections(self.stand_ins)

    def fast_fork(self, ctx: ForkContext, plan: Any) -> FastFork:
        # Nothing to do at a later fork while no TCP socket is open (the C path checks each fork).
        return FastFork(worker_plan=self.NOTHING_TO_DO, descriptor_kinds=native.TCP_SOCKET)

    def severed(self, sock: Any) -> bool:
        """Whether ``sock`` (a socket object) is one of this worker's severed descriptors."""
        return self.stand_ins is not None and self.stand_ins.severed(sock)

    def shared(self, sock: Any) -> bool:
        """Whether ``sock`` is an inherited one-way stream left shared in this worker."""
        return self.stand_ins is not None and self.stand_ins.shared(sock)


BACKEND = SocketsBackend()
