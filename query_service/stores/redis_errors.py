"""Redis not answering, as the store's error: ``StoreUnavailable`` (UNAVAILABLE to clients),
naming the host, never the URL, which may hold a password."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from materializer.clients.redis import TRANSIENT_ERRORS
from query_service.errors import StoreUnavailable

log = logging.getLogger(__name__)


@asynccontextmanager
async def unavailable_on_connection_errors(where: str) -> AsyncIterator[None]:
    """Connection failures, timeouts and a Redis Cluster down or moving slots (a master
    restarting) as ``StoreUnavailable`` (UNAVAILABLE to clients)."""
    try:
        yield
    except TRANSIENT_ERRORS as exc:
        raise unavailable(where, exc) from exc


def unavailable(where: str, exc: BaseException) -> StoreUnavailable:
    """``exc``, an error of Redis at ``where`` that a retry may outlast, as the store's."""
    log.warning("redis at %s unavailable: %s", where, exc)
    return StoreUnavailable(f"redis at {where} is unavailable ({type(exc).__name__})")
