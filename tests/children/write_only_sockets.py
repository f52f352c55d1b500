"""Workers that only write to TCP connections the parent made: a metrics stream the Dataset holds
(``sendall`` of one line per item) and a ``logging.handlers.SocketHandler`` set up in the parent.

argv: ``torch`` or ``safeloader`` (whose DataLoader runs 2 workers over 8 items), then ``stream``
or ``logging``. A collector in this process counts what reaches it. Prints one JSON line:
{"received": <lines or records the collector got>, "error": <the epoch's error, or "">}.
"""

import json
import logging
import logging.handlers
import pickle
import socket
import struct
import sys
import threading
import time

import torch.utils.data

ITEMS = 8
loader_name, case = sys.argv[1:]


class Collector:
    """Accepts connections and counts newline-ended lines (``stream``) or logging's
    length-prefixed pickled records (``logging``) on each, until told to stop."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.received: list[str] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            connection, _ = self.server.accept()
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        buffer = b""
        while chunk := connection.recv(65536):
            buffer += chunk
            while True:
                if case == "stream":
                    line, found, rest = buffer.partition(b"\n")
                    if not found:
                        break
                    message, buffer = line.decode(), rest
                else:
                    if len(buffer) < 4:
                        break
                    (size,) = struct.unpack(">L", buffer[:4])
                    if len(buffer) < 4 + size:
                        break
                    message, buffer = pickle.loads(buffer[4 : 4 + size])["msg"], buffer[4 + size :]
                with self.lock:
                    self.received.append(message)

    def wait_for(self, count: int, seconds: float) -> list[str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(self.received) < count:
            time.sleep(0.01)
        return list(self.received)


collector = Collector()
log = logging.getLogger("metrics")
log.propagate = False


class Items(torch.utils.data.Dataset):
    def __init__(self) -> None:
        if case == "stream":
            self.metrics = socket.create_connection(collector.server.getsockname())  # written, never read
        else:
            log.addHandler(logging.handlers.SocketHandler(*collector.server.getsockname()))
            log.warning("parent")  # the handler connects on its first record

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> int:
        if case == "stream":
            self.metrics.sendall(f"item {index}\n".encode())
        else:
            log.warning("item %d", index)
        return index


if loader_name == "torch":
    loader_class = torch.utils.data.DataLoader
else:
    from safeloader import DataLoader as loader_class

error = ""
try:
    assert sorted(list(loader_class(Items(), batch_size=None, num_workers=2))) == list(range(ITEMS))
except Exception as exc:  # a worker's error, re-raised here by the loader
    error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
items = [message for message in collector.wait_for(ITEMS + (case == "logging"), 5) if message != "parent"]
print(json.dumps({"received": len(items), "distinct": len(set(items)), "error": error}))
