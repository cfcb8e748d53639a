"""Free loopback ports, and whether something listens on one."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
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
