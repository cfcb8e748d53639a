"""Redis not answering, as the store's error: ``StoreUnavailable`` (UNAVAILABLE to clients),
naming the host, never the URL, which may hold a password; and a call's cancellation
kept when the client loses it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from materializer.clients.redis import TRANSIENT_ERRORS
from query_service.errors import StoreUnavailable

log = logging.getLogger(__name__)


@asynccontextmanager
async def unavailable_on_connection_errors(where: str) -> AsyncIterator[None]:
    """Connection failures, timeouts and a Redis Cluster down or moving slots (a master
    restarting) as ``StoreUnavailable`` (UNAVAILABLE to clients).

    A cancellation asked for during the call is raised even when the client lost it,
    whatever the call's outcome (a write Redis applied included). redis-py sends each
    command under ``asyncio.wait_for`` when a socket timeout is set, and Python 3.11's
    ``wait_for`` returns the reply, or raises its error, instead of the cancellation
    when both come in the same step: the caller would go on as if never cancelled (an
    ``Enrich`` stream whose client had gone waited out its freshness budget).
    """
    task = asyncio.current_task()
    asked = task.cancelling() if task is not None else 0

    def lost() -> bool:
        return task is not None and task.cancelling() > asked

    try:
        yield
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if lost():
            raise asyncio.CancelledError from exc
        if isinstance(exc, TRANSIENT_ERRORS):
            raise unavailable(where, exc) from exc
        raise
    if lost():
        raise asyncio.CancelledError


def unavailable(where: str, exc: BaseException) -> StoreUnavailable:
    """``exc``, an error of Redis at ``where`` that a retry may outlast, as the store's."""
    log.warning("redis at %s unavailable: %s", where, exc)
    return StoreUnavailable(f"redis at {where} is unavailable ({type(exc).__name__})")
