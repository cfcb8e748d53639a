"""The event loop ``query-service serve`` runs on.

uvloop by default: each lookup is a call in and a Redis command out, and
uvloop wakes up for them at less CPU than asyncio's own loop. It carries more
HTTP lookups, batch lookups and enrichments; single gRPC lookups, whose cost
is mostly grpc's own, about as many
(docs/decisions/0012-query-service-on-uvloop.md). asyncio's loop stays a
choice, for debugging and for platforms uvloop does not build on.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from materializer.errors import SetupError

T = TypeVar("T")


class EventLoop(enum.StrEnum):
    """The loops ``run`` knows."""

    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def loop_factory(loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new loop of kind ``loop``."""
    if loop is EventLoop.ASYNCIO:
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        raise SetupError("uvloop is not installed here: serve with --event-loop asyncio") from None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], loop: EventLoop = EventLoop.UVLOOP) -> T:
    """``asyncio.run(main)`` on ``loop``."""
    try:
        factory = loop_factory(loop)
    except SetupError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
