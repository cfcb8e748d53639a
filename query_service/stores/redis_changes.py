"""A map's change stream as the store reads it: the stream's bounds and the entries after an
id in one transaction, and blocking reads for followers on a pool of their own, so that
readers waiting for changes never hold the lookups' connections."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from materializer.clients.redis import AsyncClient, close_async, connect_async, is_cluster
from materializer.config import RedisConfig
from materializer.contract.redis_layout import EXPIRE_OP, changes_key, physical_name
from query_service.stores.base import Change, ChangeRead
from query_service.stores.redis_errors import unavailable_on_connection_errors

MAX_WAITING_CONNECTIONS = 10_000
"""Connections of the pool for blocking change reads: one per reader waiting at once
(Redis's own default ``maxclients``)."""


class ChangeStream:
    """The change-stream reads of one store's client; ``wait`` on a client of its own."""

    def __init__(
        self, client: AsyncClient, config: RedisConfig | None, where: str, reply_seconds: float
    ) -> None:
        self._client = client
        self._config = config
        self._where = where
        self._reply_seconds = reply_seconds
        self._waiting: AsyncClient | None = None

    async def last_id(self, physical: str) -> str | None:
        """``XREVRANGE <map>:__changes__ + - COUNT 1``."""
        async with unavailable_on_connection_errors(self._where):
            newest = await self._client.xrevrange(changes_key(physical), count=1)
        return _entry_id(cast("list[tuple[bytes, Any]]", newest))

    async def read(self, map_name: str, generation: int, after: str, count: int) -> ChangeRead:
        """The oldest and newest entry ids and ``XREAD COUNT`` after ``after``, in one ``MULTI``.

        The transaction touches one key, so it works on Redis Cluster too, and
        no trim can fall between reading the bounds and reading the changes.
        """
        stream = changes_key(physical_name(map_name, generation))
        async with (
            unavailable_on_connection_errors(self._where),
            self._client.pipeline(transaction=True) as pipe,
        ):
            pipe.xrange(stream, count=1)
            pipe.xrevrange(stream, count=1)
            pipe.xread({stream: after}, count=count)
            oldest, newest, read = await pipe.execute()
        entries = read[0][1] if read else []
        return ChangeRead(
            changes=[_change(entry_id, fields) for entry_id, fields in entries],
            first_id=_entry_id(oldest),
            last_id=_entry_id(newest),
            generation=generation,
        )

    async def wait(self, physical: str, after: str, timeout: float) -> None:
        """``XREAD BLOCK`` on a pool of its own, bounded by the block plus the socket timeout.

        Each waiting reader holds a connection while it waits; a separate pool
        keeps them from taking the lookups' connections. That pool has no
        socket timeout of its own (a read may last the whole block); the
        bound is applied around the call instead, with ``asyncio.timeout``,
        which, unlike the ``asyncio.wait_for`` redis-py applies with a socket
        timeout, never loses a cancellation on Python 3.11. A cancelled wait
        drops its connection (redis-py disconnects), so no late reply can
        reach the next user of it.
        """
        block_ms = max(1, int(timeout * 1000))  # 0 would block forever
        stream = changes_key(physical)
        async with unavailable_on_connection_errors(self._where):
            try:
                async with asyncio.timeout(timeout + self._reply_seconds):
                    await self._waiting_client().xread({stream: after}, count=1, block=block_ms)
            except TimeoutError:  # the built-in one: asyncio.timeout expired
                raise RedisTimeoutError("no reply to a blocking read in time") from None

    def _waiting_client(self) -> AsyncClient:
        if self._waiting is None:
            self._waiting = self._blocking_client()
        return self._waiting

    def _blocking_client(self) -> AsyncClient:
        """The lookups' client again, with no socket timeout and room for every waiter."""
        if is_cluster(self._client):
            if self._config is None:
                raise ValueError("a cluster store needs its config: RedisMapStore.from_config")
            return connect_async(
                self._config, socket_timeout=None, max_connections=MAX_WAITING_CONNECTIONS
            )
        pool = self._client.connection_pool
        kwargs = {**pool.connection_kwargs, "socket_timeout": None}
        return aioredis.Redis(
            connection_pool=aioredis.ConnectionPool(
                connection_class=pool.connection_class,
                max_connections=MAX_WAITING_CONNECTIONS,
                **kwargs,
            )
        )

    async def close(self) -> None:
        """Close the waiting readers' pool, if one was made."""
        if self._waiting is not None:
            await close_async(self._waiting)


def _entry_id(entries: list[tuple[bytes, Any]]) -> str | None:
    """The id of the only entry of an ``XRANGE ... COUNT 1`` reply."""
    return entries[0][0].decode() if entries else None


def _change(entry_id: bytes, fields: dict[bytes, bytes]) -> Change:
    """One ``<map>:__changes__`` entry (``materializer.contract.redis_layout.change_entry``)."""
    op = fields[b"op"]
    return Change(
        change_id=entry_id.decode(),
        key=fields[b"key"].decode(),
        deleted=op != b"upsert",
        batch_id=int(fields[b"batch_id"]),
        expired=op == EXPIRE_OP.encode(),
    )
