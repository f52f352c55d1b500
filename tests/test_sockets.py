"""HTTP keep-alive connections made in a Dataset's __init__: each worker gets its own.

Under torch's DataLoader the parent and every worker share one TCP stream and
read each other's responses; the "sockets" hook gives each worker a severed
descriptor that looks closed by the server, so the clients reconnect. A stream the
parent only wrote to (a metrics stream, logging's SocketHandler) stays shared, as
under torch: whole messages written by several processes reach the peer whole.
"""

from __future__ import annotations

import http.client
import json
import os
import socket

import pytest
from torch.utils.data import Dataset

from benchmarks.http_server import Server
from safeloader import DataLoader
from safeloader.backends import sockets as sockets_backend

from .helpers import FAILURES, assert_torch_loader_fails, check_workers_and_parent
from .http_data import CERTIFICATE, HttpRecords
from .subproc import check_script

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(90)]

CLIENTS = ("requests", "urllib3", "http.client", "requests over TLS", "http.client over TLS")



def parent_socket(dataset: HttpRecords) -> socket.socket:
    """The parent's kept-alive socket of the dataset's client."""
    if dataset.client == "http.client":
        return dataset.connection.sock
    manager = dataset.session.get_adapter(dataset.base).poolmanager if dataset.client == "requests" else dataset.pool
    (key,) = manager.pools.keys()
    (connection,) = [c for c in manager.pools[key].pool.queue if c is not None]
    return connection.sock


@pytest.mark.parametrize("client", CLIENTS)
def test_keep_alive_clients_made_in_init_read_correct_bytes_in_4_workers(client):
    with Server(certificate=CERTIFICATE if client.endswith("TLS") else None) as server:
        dataset = HttpRecords(server.base, client)
        before = parent_socket(dataset).getsockname()
        check_workers_and_parent(dataset, server.data)
        # The parent kept its own connection throughout: workers never closed or used it.
        assert parent_socket(dataset).getsockname() == before


@pytest.mark.torch_baseline
@pytest.mark.timeout(240)
@pytest.mark.parametrize("client", CLIENTS)
def test_same_clients_under_torch_loader_read_wrong_bytes_or_fail(client):
    # One connection read by several processes: a worker reads another one's response (wrong data),
    # waits for one another worker read (a hang), or gets a broken record or status line (an error,
    # usual over TLS). Which one a run shows is a race: any of the three is torch's failure here.
    assert_torch_loader_fails("tests.http_data:http_case", client, expect=FAILURES, tries=3)


class ConnectedOnly(HttpRecords):
    """HttpRecords through an http.client connection the parent connected but never sent a request on."""

    def __init__(self, base: str) -> None:
        self.base, self.client = base, "http.client"
        host, port = base.split("://")[1].split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=10)
        self.connection.connect()


def test_an_http_client_connection_the_parent_never_used_is_not_shared_by_the_workers_requests():
    # Nothing received before the fork, so the stream is left shared; the worker's first request on
    # it reconnects instead of starting a conversation whose response another process could read.
    with Server() as server:
        dataset = ConnectedOnly(server.base)
        check_workers_and_parent(dataset, server.data)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["stream", "logging"])
def test_streams_the_workers_only_write_to_stay_shared_and_deliver_every_message_as_under_torch(case):
    # A metrics stream the Dataset writes a line per item to, and a logging SocketHandler the parent
    # set up: severed, the first fails the epoch (BrokenPipeError) and the second loses each worker's
    # first record; torch's loader delivers them all.
    for loader in ("torch", "safeloader"):
        found = json.loads(check_script("write_only_sockets.py", loader, case, timeout=60).stdout.splitlines()[-1])
        assert found == {"received": 8, "distinct": 8, "error": ""}, (loader, found)


class InheritedSockets(Dataset):
    """Reports, in the worker, which inherited sockets are still the parent's (by inode)."""

    def __init__(self, server: Server) -> None:
        self.connected = socket.create_connection(server.httpd.server_address)
        # A conversation: the parent sent a request and read the response, so the worker's is severed.
        self.connected.sendall(b"GET /r/3 HTTP/1.1\r\nHost: x\r\n\r\n")
        response = http.client.HTTPResponse(self.connected)
        response.begin()
        assert response.read() == server.data[3].tobytes()
        self.one_way = socket.create_connection(server.httpd.server_address)  # never read: left shared
        self.listening = server.httpd.socket
        self.pair = socket.socketpair()
        self.unix_listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix_listening.bind("\0safeloader-test-" + str(os.getpid()))
        self.unix_listening.listen()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.connect(("127.0.0.1", 9))
        self.unconnected = socket.socket()
        self.inodes = self.current_inodes()

    def sockets(self) -> dict[str, socket.socket]:
        return {"connected": self.connected, "one_way": self.one_way, "listening": self.listening, "pair": self.pair[0],
                "unix_listening": self.unix_listening, "udp": self.udp, "unconnected": self.unconnected}

    def current_inodes(self) -> dict[str, int]:
        return {name: os.fstat(s.fileno()).st_ino for name, s in self.sockets().items()}

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int):
        kept = {name: ino == self.inodes[name] for name, ino in self.current_inodes().items()}
        if kept["connected"]:  # still the parent's stream (hook disabled): do not touch it
            return {"kept": kept}
        read = self.connected.recv(10)
        try:
            self.connected.sendall(b"GET / HTTP/1.1\r\n\r\n")
            send_error = ""
        except OSError as exc:
            send_error = type(exc).__name__
        self.pair[0].sendall(b"ping")  # the worker's own socketpair end still reaches the parent's
        return {"kept": kept, "read": read, "send_error": send_error}

    def close(self) -> None:
        for s in (*self.sockets().values(), self.pair[1]):
            if s is not self.listening:
                s.close()


def test_only_tcp_conversations_are_replaced_and_look_closed_by_the_peer():
    with Server() as server:
        dataset = InheritedSockets(server)
        try:
            (item,) = list(DataLoader(dataset, batch_size=None, num_workers=1))
            assert item["kept"] == {"connected": False, "one_way": True, "listening": True, "pair": True,
                                    "unix_listening": True, "udp": True, "unconnected": True}
            assert item["read"] == b""  # end-of-file, as from a server that closed the connection
            assert item["send_error"] == "BrokenPipeError"
            assert dataset.pair[1].recv(4) == b"ping"
            # The parent's connection is untouched: still the same, still connected.
            assert dataset.current_inodes() == dataset.inodes
            assert dataset.connected.getpeername() == server.httpd.server_address
            dataset.connected.sendall(b"GET /r/3 HTTP/1.1\r\nHost: x\r\n\r\n")
            response = http.client.HTTPResponse(dataset.connected)
            response.begin()
            assert response.read() == server.data[3].tobytes()
        finally:
            dataset.close()


def test_sockets_hook_can_be_disabled_per_loader():
    with Server() as server:
        dataset = InheritedSockets(server)
        try:
            (item,) = list(DataLoader(dataset, batch_size=None, num_workers=1, disable_hooks=("sockets",)))
            assert item["kept"]["connected"] is True
        finally:
            dataset.close()


def test_is_severed_is_false_outside_workers():
    with socket.socket() as s:
        assert not sockets_backend.BACKEND.severed(s)
