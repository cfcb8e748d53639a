"""A TCP proxy in front of a Redis server that can hold one client's write in flight.

A worker paused in the middle of a batch holds a write it has not sent yet: the write
goes out when the worker runs again, after another worker took the map over. Where a
SIGSTOP lands is chance, so the proxy makes it certain: once ``arm``-ed, the first
connection that sends a command naming ``pattern`` (a fold function) is held, that
command and everything after it, until ``release``; the server's replies to it after the
release are kept, so a test reads what the server answered the late write.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

CHUNK = 65536


class HeldWrites:
    """Listens on ``port`` and forwards every connection to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pattern: bytes | None = None
        self._held: socket.socket | None = None
        self._pending = bytearray()
        self._released = False
        self.held = threading.Event()
        """Set once a connection's write is held."""
        self.replies = bytearray()
        """What the server answered the held connection after its release."""
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, pattern: bytes) -> None:
        """Hold the next connection that sends ``pattern`` (checked per received chunk)."""
        with self._lock:
            self._pattern = pattern

    def release(self) -> None:
        """Send what was held, in order; the connection flows freely from now on."""
        with self._lock:
            if self._held is not None and not self._released:
                self._held.sendall(self._pending)
            self._released = True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._upstream)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        tail = b""
        while data := _receive(client):
            with self._lock:
                seen, tail = tail + data, data[-64:]
                if self._pattern is not None and self._pattern in seen:
                    self._pattern, self._held = None, server
                    self.held.set()
                if self._held is server and not self._released:
                    self._pending += data
                    continue
                with contextlib.suppress(OSError):
                    server.sendall(data)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _replies(self, server: socket.socket, client: socket.socket) -> None:
        while data := _receive(server):
            with self._lock:
                if self._held is server and self._released:
                    self.replies += data
            with contextlib.suppress(OSError):
                client.sendall(data)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> HeldWrites:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()


def _receive(sock: socket.socket) -> bytes:
    """The next bytes from ``sock``; empty once it is closed."""
    try:
        return sock.recv(CHUNK)
    except OSError:
        return b""
