"""Free loopback ports, and whether something listens on one."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager

LISTEN_PORTS = range(10_000, 32_768)
"""Where ``free_port`` looks: below Linux's default ephemeral range (32768-60999), from
which the kernel gives every outgoing connection its local port. A port picked there
and bound a moment later can be taken meanwhile by a connection, say a Kafka client
retrying a stopped broker a hundred times a second, and the server then fails to start."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the range the
    kernel takes outgoing connections' ports from (``LISTEN_PORTS``)."""
    for _ in range(100):
        port = random.choice(LISTEN_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses every connection while the block runs: bound,
    never listening, so nothing else can take it.

    For a server that is down. A port that is merely free (``free_port``) can be
    taken meanwhile, by another server or as a client's own ephemeral port: a client
    that retries a connection to a free ephemeral port may get that port for itself
    and connect to itself (TCP's simultaneous open), then wait for an answer to its
    own bytes.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
