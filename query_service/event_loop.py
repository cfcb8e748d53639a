"""The event loop ``query-service serve`` runs on.

uvloop by default: every lookup is a gRPC or HTTP call in and a Redis command
out, so the loop's own cost per wake-up is a large share of a lookup's CPU,
and uvloop's is a fraction of asyncio's (``bench/query.py --event-loop``
measures both, its baselines on the same loop as the service). asyncio's own
loop stays a choice, for debugging and for platforms without uvloop.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoop(enum.StrEnum):
    """The loops ``run`` knows."""

    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def run(main: Coroutine[Any, Any, T], loop: EventLoop = EventLoop.UVLOOP) -> T:
    """``asyncio.run(main)`` on ``loop``."""
    if loop is EventLoop.UVLOOP:
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
