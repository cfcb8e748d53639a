"""Maps read from the Redis layout the materializer writes (``contract.redis_layout``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import TimeoutError as RedisTimeoutError

from materializer.config import RedisConfig
from materializer.contract.redis_client import (
    TRANSIENT_ERRORS,
    AsyncClient,
    connect_async,
    markers,
    queue_gets,
    where,
)
from materializer.contract.redis_layout import (
    EXPIRE_OP,
    Watermark,
    changes_key,
    entity_key,
    meta_key,
    physical_name,
    status_key,
)
from query_service.errors import StoreUnavailable
from query_service.stores.base import BatchLookup, Change, ChangeRead, Lookup, MapStore
from query_service.stores.cluster_reads import MasterReads
from query_service.stores.coalesce import Coalescer
from query_service.stores.generations import Generations

log = logging.getLogger(__name__)

REPLY_SECONDS = 5.0
"""How long a blocking read may outlast its block when the URL sets no socket timeout."""
WATERMARK_SECONDS = 0.05
"""How long lookups reuse a map's watermark before one of them reads it again: an older
watermark is still a lower bound of what they read after it, and one ``HGETALL`` per map
per interval, not per lookup, is what a lookup's CPU gains."""
CHECK_SECONDS = 1.0
"""How often lookups that found their keys look for markers not seen yet."""
MAX_WAITING_CONNECTIONS = 10_000
"""Connections of the pool for blocking change reads: one per reader waiting at once
(Redis's own default ``maxclients``)."""


# Defaults for a lookup service: fail fast and let the client's retry policy
# (it sees UNAVAILABLE) decide, rather than hold an RPC for seconds while
# redis-py retries (its default: 10 times). Query parameters in the URL
# (``?socket_timeout=1``) win over these.
def _client_defaults() -> dict[str, Any]:
    return {
        "socket_connect_timeout": 2.0,
        "socket_timeout": 5.0,
        "health_check_interval": 30,
        # One quick retry covers a pooled connection that Redis closed meanwhile.
        "retry": Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), retries=1),
    }


@asynccontextmanager
async def unavailable_on_connection_errors(where: str) -> AsyncIterator[None]:
    """Connection failures, timeouts and a Redis Cluster down or moving slots (a master
    restarting) as ``StoreUnavailable`` (UNAVAILABLE to clients)."""
    try:
        yield
    except TRANSIENT_ERRORS as exc:
        log.warning("redis at %s unavailable: %s", where, exc)
        raise StoreUnavailable(f"redis at {where} is unavailable ({type(exc).__name__})") from exc


class RedisMapStore(MapStore):
    """One shared ``redis.asyncio`` client (a connection pool, or a pool per node of a
    Redis Cluster) for the whole process.

    Replies are parsed by hiredis, which redis-py picks by itself when it is
    installed (the ``redis[hiredis]`` extra). Connection failures and timeouts
    raise ``StoreUnavailable`` naming the host, never the URL, which may hold
    a password.
    """

    def __init__(self, client: AsyncClient, config: RedisConfig | None = None) -> None:
        self._client = client
        self._config = config
        kwargs = (
            client.connection_kwargs
            if isinstance(client, AsyncRedisCluster)
            else client.connection_pool.connection_kwargs
        )
        self._where = where(client)
        self._waiting: AsyncClient | None = None
        self._reply_seconds = float(kwargs.get("socket_timeout") or REPLY_SECONDS)
        self._coalescer = Coalescer(self.get_many)
        self._masters = MasterReads(client) if isinstance(client, AsyncRedisCluster) else None
        self._generations = Generations(client)
        self._marks: dict[str, tuple[float, Watermark | None]] = {}
        """Per physical map: when its newest watermark read started, and what it read."""
        self._whole: set[str] = set()
        """Physical maps whose markers were all seen: a later miss without them is a loss."""
        self._checked: dict[str, float] = {}

    @property
    def client(self) -> AsyncClient:
        """The shared client, for the other stores of the process (admin, change streams)."""
        return self._client

    @classmethod
    def from_url(cls, url: str) -> RedisMapStore:
        """A store on one server's ``redis://`` / ``rediss://`` / ``unix://`` URL."""
        return cls.from_config(RedisConfig(url=url))

    @classmethod
    def from_config(cls, config: RedisConfig) -> RedisMapStore:
        """A store on the configured server or cluster; connects on first use."""
        return cls(connect_async(config, **_client_defaults()), config)

    def _unavailable_on_connection_errors(self) -> AbstractAsyncContextManager[None]:
        return unavailable_on_connection_errors(self._where)

    async def generation(self, map_name: str) -> int:
        """The generation lookups read, refreshed twice a second (``stores.generations``)."""
        async with self._unavailable_on_connection_errors():
            return await self._generations.generation(map_name)

    async def _physical(self, map_name: str) -> str:
        return physical_name(map_name, await self.generation(map_name))

    async def get(self, map_name: str, key: str) -> bytes | None:
        """``GET <map>:<key>`` (of the map's current generation, as every read here)."""
        physical = await self._physical(map_name)
        async with self._unavailable_on_connection_errors():
            value = await self._client.get(entity_key(physical, key))
        return cast("bytes | None", value)  # bytes: the client does not decode replies

    async def watermark(self, map_name: str) -> Watermark | None:
        """``HGETALL <map>:__meta__``, read now (lookups after it reuse it)."""
        physical = await self._physical(map_name)
        started = time.monotonic()
        async with self._unavailable_on_connection_errors():
            raw = await self._client.hgetall(meta_key(physical))
        mark = Watermark.from_hash(cast("dict[bytes, bytes]", raw))
        self._keep_mark(physical, started, mark)
        return mark

    def _keep_mark(self, physical: str, started: float, mark: Watermark | None) -> None:
        """Keep the newest read: a read that started earlier never replaces a later one."""
        kept = self._marks.get(physical)
        if kept is None or kept[0] <= started:
            self._marks[physical] = (started, mark)

    def _fresh_mark(self, physical: str, now: float) -> tuple[float, Watermark | None] | None:
        kept = self._marks.get(physical)
        return kept if kept is not None and now - kept[0] < WATERMARK_SECONDS else None

    async def get_with_watermark(self, map_name: str, key: str) -> Lookup:
        """``HGETALL`` then ``MGET`` in one pipeline, shared by the lookups of the same turn.

        No ``MULTI``: it would give an exact snapshot but fails on Redis Cluster,
        where ``<map>:<key>`` and ``<map>:__meta__`` live in different slots;
        reading the watermark first gives the lower bound ``MapStore`` promises.
        Concurrent calls are gathered by a ``Coalescer`` (one pipeline for all).
        """
        return await self._coalescer.get(map_name, key)

    async def get_many(self, map_name: str, keys: Sequence[str]) -> BatchLookup:
        """``HGETALL`` then ``MGET`` in one pipeline (no ``MULTI``, as for a single key)."""
        return (await self.get_across({map_name: keys}))[map_name]

    async def get_across(self, keys_by_map: Mapping[str, Sequence[str]]) -> dict[str, BatchLookup]:
        """Per map ``HGETALL <map>:__meta__`` (unless read within ``WATERMARK_SECONDS``) then
        ``MGET`` of its keys, all in one pipeline (one ``GET`` per key on a Redis Cluster,
        ``materializer.contract.redis_client.queue_gets``)."""
        names = list(keys_by_map)
        physical = {name: await self._physical(name) for name in names}
        now = time.monotonic()
        kept = {name: self._fresh_mark(physical[name], now) for name in names}
        if self._masters is not None:
            return await self._get_across_cluster(keys_by_map, physical, kept, now)
        takes = []
        async with (
            self._unavailable_on_connection_errors(),
            self._client.pipeline(transaction=False) as pipe,
        ):
            for name in names:
                if kept[name] is None:
                    pipe.hgetall(meta_key(physical[name]))
                keys = keys_by_map[name]
                takes.append(queue_gets(pipe, [entity_key(physical[name], k) for k in keys]))
            replies = iter(await pipe.execute())
        out = {}
        for name, take in zip(names, takes, strict=True):
            fresh = kept[name]
            if fresh is None:
                mark = Watermark.from_hash(next(replies))
                self._keep_mark(physical[name], now, mark)
            else:
                mark = fresh[1]
            entities = take(replies)
            out[name] = BatchLookup(entities=entities, watermark=mark)
            missing = any(entity is None for entity in entities)
            if missing or self._unchecked(physical[name]):
                await self._check_whole(name, physical[name], missing)
        return out

    async def _get_across_cluster(
        self,
        keys_by_map: Mapping[str, Sequence[str]],
        physical: dict[str, str],
        kept: dict[str, tuple[float, Watermark | None] | None],
        now: float,
    ) -> dict[str, BatchLookup]:
        """``get_across`` on a Redis Cluster: the watermarks to read first, then every key
        in one pipeline per master (``cluster_reads``)."""
        assert self._masters is not None
        stale = [name for name in keys_by_map if kept[name] is None]
        marks = {name: kept_mark[1] for name, kept_mark in kept.items() if kept_mark is not None}
        async with self._unavailable_on_connection_errors():
            if stale:
                async with self._client.pipeline(transaction=False) as pipe:
                    for name in stale:
                        pipe.hgetall(meta_key(physical[name]))
                    for name, raw in zip(stale, await pipe.execute(), strict=True):
                        marks[name] = Watermark.from_hash(raw)
                        self._keep_mark(physical[name], now, marks[name])
            flat = [entity_key(physical[n], k) for n, keys in keys_by_map.items() for k in keys]
            values = iter(await self._masters.get(flat))
        out = {}
        for name, keys in keys_by_map.items():
            entities = [next(values) for _ in keys]
            out[name] = BatchLookup(entities=entities, watermark=marks[name])
            missing = any(entity is None for entity in entities)
            if missing or self._unchecked(physical[name]):
                await self._check_whole(name, physical[name], missing)
        return out

    def _unchecked(self, physical: str) -> bool:
        """Whether a lookup that found every key should look for the map's markers: until
        they were seen, once a second (a map without them costs its hits nothing more)."""
        if physical in self._whole:
            return False
        now = time.monotonic()
        if now - self._checked.get(physical, -CHECK_SECONDS) < CHECK_SECONDS:
            return False
        self._checked[physical] = now
        return True

    async def _check_whole(self, map_name: str, physical: str, missing: bool) -> None:
        """Raise ``StoreUnavailable`` when a key is missing from a copy Redis lost.

        Every master holds the map's marker while its copy is whole
        (``materializer.contract.redis_layout.marker_key``). A copy once seen whole here, or
        whose materializer reports on it, and now without a marker was lost
        (a server restarted empty) and is being restored: its missing keys may
        exist, so they are UNAVAILABLE (clients retry), never NOT_FOUND. A map
        no materializer ever marked (written by other means) answers as it is.
        """
        marks = list(markers(self._client, physical).values())
        async with (
            self._unavailable_on_connection_errors(),
            self._client.pipeline(transaction=False) as pipe,
        ):
            for key in marks:
                pipe.exists(key)
            pipe.exists(status_key(map_name))
            *found, reported = await pipe.execute()
        if all(found):
            self._whole.add(physical)
            return
        if missing and (physical in self._whole or reported):
            raise StoreUnavailable(
                f"map {map_name}: Redis lost its copy, which the materializer is restoring "
                "from Delta and the changelog; retry shortly"
            )

    async def last_change_id(self, map_name: str) -> str | None:
        """``XREVRANGE <map>:__changes__ + - COUNT 1``."""
        physical = await self._physical(map_name)
        async with self._unavailable_on_connection_errors():
            newest = await self._client.xrevrange(changes_key(physical), count=1)
        return _entry_id(cast("list[tuple[bytes, Any]]", newest))

    async def read_changes(self, map_name: str, after: str, count: int) -> ChangeRead:
        """The oldest and newest entry ids and ``XREAD COUNT`` after ``after``, in one ``MULTI``.

        The transaction touches one key, so it works on Redis Cluster too, and
        no trim can fall between reading the bounds and reading the changes.
        """
        generation = await self.generation(map_name)
        stream = changes_key(physical_name(map_name, generation))
        async with (
            self._unavailable_on_connection_errors(),
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

    async def wait_for_changes(self, map_name: str, after: str, timeout: float) -> None:
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
        stream = changes_key(await self._physical(map_name))
        async with self._unavailable_on_connection_errors():
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
        if isinstance(self._client, AsyncRedisCluster):
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
        """Close the pools' connections."""
        if self._masters is not None:
            await self._masters.close()
        for client in (self._waiting, self._client):
            if isinstance(client, AsyncRedisCluster):
                await client.aclose()
            elif client is not None:
                await client.aclose(close_connection_pool=True)


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
