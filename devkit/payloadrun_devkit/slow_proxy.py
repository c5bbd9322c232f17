"""A TCP proxy on loopback that holds each answer back: a server under load, for tests::

    with SlowProxy(("127.0.0.1", 6443)) as proxy:
        proxy.delay = 3.0  # each answer now starts 3 s after its request
        ...  # talk to https://127.0.0.1:{proxy.port}

It forwards bytes both ways unchanged (TLS passes through: the client still verifies the server's
certificate), and holds the first bytes the server sends after each request for ``delay``
seconds, as an API server that takes that long to answer does. ``delay`` may change at any time;
it applies to answers not yet started.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

CHUNK = 65536


class SlowProxy:
    def __init__(self, upstream: tuple[str, int], delay: float = 0.0) -> None:
        self.upstream = upstream
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        self.connections = 0  # accepted so far

    def __enter__(self) -> SlowProxy:
        threading.Thread(target=self._accept, name="slow-proxy", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            self.connections += 1
            asked = threading.Event()  # a request went up, its answer not yet started
            threading.Thread(target=self._up, args=(client, server, asked), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, asked), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, asked: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(CHUNK):
                asked.set()
                server.sendall(data)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _down(self, server: socket.socket, client: socket.socket, asked: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(CHUNK):
                if asked.is_set():
                    asked.clear()
                    time.sleep(self.delay)
                client.sendall(data)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)
