"""A local HTTP/1.1 keep-alive server for the benchmark suite and the socket and fsspec tests.

It listens on 127.0.0.1 only, on a free port, serves fixed records and one
blob (with ``Range`` and ``HEAD`` support, as fsspec's HTTP filesystem needs),
and stops by itself after ``lifetime`` seconds even if nobody stops it. It
lives here, not in tests/, so that the benchmarks never import the tests; the
tests import it from here (and bring their own TLS certificate).
"""

from __future__ import annotations

import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

RECORD = 64
COUNT = 256


def records(seed: int = 0) -> np.ndarray:
    """What ``/r/<i>`` serves: record i (``RECORD`` bytes); ``/blob`` is all of them in a row."""
    return np.random.default_rng(seed).integers(0, 256, (COUNT, RECORD), dtype=np.uint8)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection serves many requests

    def _body(self) -> bytes | None:
        blob: bytes = self.server.blob  # type: ignore[attr-defined]
        if self.path == "/blob":
            return blob
        match = re.fullmatch(r"/r/(\d+)", self.path)
        if match and int(match.group(1)) < COUNT:
            i = int(match.group(1))
            return blob[i * RECORD:(i + 1) * RECORD]
        return None

    def _respond(self, with_body: bool) -> None:
        body = self._body()
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status, start, end = 200, 0, len(body)
        found = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if found:
            start = int(found.group(1))
            end = min(len(body), int(found.group(2)) + 1) if found.group(2) else len(body)
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(body)}")
        self.end_headers()
        if with_body:
            self.wfile.write(body[start:end])

    def do_GET(self) -> None:
        self._respond(with_body=True)

    def do_HEAD(self) -> None:
        self._respond(with_body=False)

    def log_message(self, *args: object) -> None:
        pass


class Server:
    """``with Server() as server: server.url(...)``; stops at exit or after ``lifetime`` s.
    ``certificate``: HTTPS with that PEM file (certificate and key; clients verify against it)."""

    def __init__(self, seed: int = 0, lifetime: float = 120.0, certificate: str | None = None) -> None:
        self.data = records(seed)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.blob = self.data.tobytes()  # type: ignore[attr-defined]
        if certificate is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certificate)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.base = f"{'https' if certificate else 'http'}://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True

    def url(self, path: str) -> str:
        return self.base + path

    def start(self) -> Server:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.cancel()
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
