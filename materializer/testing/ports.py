"""Free loopback ports and waiting for a service to come up."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_until(
    what: str, ready: Callable[[], bool], timeout: float, alive: Callable[[], bool]
) -> None:
    """Poll ``ready`` until it holds; fail fast when ``alive`` says the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited while starting")
        try:
            if ready():
                return
        except Exception:  # noqa: S110 - not ready yet; any failure means poll again
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s")
