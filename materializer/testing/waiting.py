"""Bounded waits for something another process does: a server starting, a map folding a
topic, a stream catching up. They poll; they never assert how long it took.

Both return as soon as ``condition`` holds and raise ``TimeoutError`` naming ``what``
after ``timeout`` seconds. The synchronous form also takes ``alive``: ``RuntimeError``
at once when the process being waited on died, so a crash is reported as a crash
rather than as a timeout minutes later.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


def wait_until(
    what: str,
    condition: Callable[[], bool],
    timeout: float = 180.0,
    alive: Callable[[], bool] | None = None,
    *,
    retry_errors: bool = False,
    interval: float = 0.2,
) -> None:
    """Poll ``condition`` until it holds.

    ``retry_errors``: an exception from ``condition`` means "not yet" (a server
    refusing connections while it starts); otherwise it propagates at once.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        if alive is not None and not alive():
            raise RuntimeError(f"{what}: the process exited while waiting")
        try:
            if condition():
                return
            last = None  # answered: an earlier error no longer describes the wait
        except Exception as exc:
            if not retry_errors:
                raise
            last = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last})" if last is not None else ""
            raise TimeoutError(f"{what}: not there after {timeout:.0f} s{detail}")
        time.sleep(interval)


async def eventually(
    what: str,
    condition: Callable[[], bool | Awaitable[bool]],
    timeout: float = 30.0,
    *,
    interval: float = 0.05,
) -> None:
    """Poll ``condition`` (plain or a coroutine function) on the event loop until it holds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not there after {timeout:.0f} s")
        await asyncio.sleep(interval)
