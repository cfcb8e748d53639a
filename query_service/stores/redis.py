"""Maps read from the Redis layout the materializer writes (``contract.redis_layout``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from materializer.clients.redis import (
    TRANSIENT_ERRORS,
    AsyncClient,
    close_async,
    connect_async,
    connection_options,
    is_cluster,
    where,
)
from materializer.config import RedisConfig
from materializer.contract.markers import markers
from materializer.contract.redis_layout import entity_key, meta_key, physical_name, status_key
from materializer.contract.watermark import Watermark
from query_service.errors import MapRestoring
from query_service.stores.base import BatchLookup, ChangeRead, Lookup, MapStore
from query_service.stores.cluster_reads import MasterReads
from query_service.stores.coalesce import Coalescer
from query_service.stores.generations import Generations
from query_service.stores.lookup_connection import LookupConnection, Replies, settled
from query_service.stores.redis_changes import ChangeStream
from query_service.stores.redis_errors import unavailable, unavailable_on_connection_errors

log = logging.getLogger(__name__)

REPLY_SECONDS = 5.0
"""How long a blocking read may outlast its block when the URL sets no socket timeout."""
WATERMARK_SECONDS = 0.05
"""How long lookups reuse a map's watermark before one of them reads it again: an older
watermark is still a lower bound of what they read after it, and one ``HGETALL`` per map
per interval, not per lookup, is what a lookup's CPU gains."""
CHECK_SECONDS = 1.0
"""How often lookups that found their keys look for markers not seen yet."""


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


class RedisMapStore(MapStore):
    """One shared ``redis.asyncio`` client (a connection pool, or a pool per node of a
    Redis Cluster) for the whole process, and on one server one pipelined connection
    for the lookups (``Get``, ``BatchGet``, ``Enrich``: ``lookup_connection``).

    Replies are parsed by hiredis, which redis-py picks by itself when it is
    installed (the ``redis[hiredis]`` extra). Connection failures and timeouts
    raise ``StoreUnavailable`` naming the host, never the URL, which may hold
    a password.
    """

    def __init__(self, client: AsyncClient, config: RedisConfig | None = None) -> None:
        self._client = client
        self._config = config
        kwargs = connection_options(client)
        self._where = where(client)
        self._reply_seconds = float(kwargs.get("socket_timeout") or REPLY_SECONDS)
        self._changes = ChangeStream(client, config, self._where, self._reply_seconds)
        self._coalescer = Coalescer(self.get_many)
        self._masters = MasterReads(client, self._reply_seconds) if is_cluster(client) else None
        self._lookups = (
            None
            if is_cluster(client)
            else LookupConnection(client.connection_pool, self._where, self._reply_seconds)
        )
        self._mark_reads: dict[str, tuple[Replies, asyncio.Future[Any]]] = {}
        """Per physical map: the watermark read written and not answered yet, with its
        connection; the lookups written after it on that connection share it."""
        self._restored: set[str] = set()
        """Physical maps seen lost (and since restored, or being restored)."""
        self._marker_reads: dict[str, asyncio.Task[tuple[bool, bool]]] = {}
        """Per physical map: the marker read not started yet, which lookups share."""
        self._generations = Generations(client)
        self._marks: dict[str, tuple[float, Watermark | None]] = {}
        """Per physical map: when its newest watermark read started, and what it read."""
        self._whole: set[str] = set()
        """Physical maps whose markers were all seen: a later miss without them is a loss."""
        self._checked: dict[str, float] = {}

    @property
    def where(self) -> str:
        """Host and port of the server (or the cluster node given), for messages."""
        return self._where

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
        generation = self._generations.known(map_name)
        if generation is None:
            generation = await self.generation(map_name)
        return physical_name(map_name, generation)

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
        """``HGETALL`` (unless read within ``WATERMARK_SECONDS``) then ``GET``.

        No ``MULTI``: it would give an exact snapshot but fails on Redis Cluster,
        where ``<map>:<key>`` and ``<map>:__meta__`` live in different slots;
        reading the watermark first gives the lower bound ``MapStore`` promises.
        On one server both go down the lookups' pipelined connection, one after
        the other; on a cluster, concurrent calls are gathered by a ``Coalescer``
        (one read per master for all).
        """
        if self._lookups is None:
            return await self._coalescer.get(map_name, key)
        batch = (await self._look_up({map_name: (key,)}))[map_name]
        return Lookup(entity=batch.entities[0], watermark=batch.watermark)

    async def get_many(self, map_name: str, keys: Sequence[str]) -> BatchLookup:
        """``HGETALL`` then ``MGET``, written together (no ``MULTI``, as for a single key)."""
        return (await self.get_across({map_name: keys}))[map_name]

    async def get_across(self, keys_by_map: Mapping[str, Sequence[str]]) -> dict[str, BatchLookup]:
        """Per map ``HGETALL <map>:__meta__`` (unless read within ``WATERMARK_SECONDS``) then
        ``MGET`` of its keys, all written at once (on a Redis Cluster, the watermarks first,
        then a read per master: ``cluster_reads``)."""
        if self._lookups is not None:
            return await self._look_up(keys_by_map)
        physical = {name: await self._physical(name) for name in keys_by_map}
        now = time.monotonic()
        kept = {name: self._fresh_mark(physical[name], now) for name in keys_by_map}
        return await self._get_across_cluster(keys_by_map, physical, kept, now)

    async def _look_up(self, keys_by_map: Mapping[str, Sequence[str]]) -> dict[str, BatchLookup]:
        """``get_across`` on one server, down the lookups' connection: per map its watermark
        read (or the one in flight, or none within ``WATERMARK_SECONDS``), then ``GET``
        of a single key or ``MGET`` of several, all written before any reply is awaited.
        A connection Redis closed meanwhile is tried once more (reads are idempotent)."""
        assert self._lookups is not None
        for attempt in (1, 2):
            try:
                return await self._look_up_once(self._lookups, keys_by_map)
            except RedisConnectionError as exc:
                if attempt == 2:
                    raise unavailable(self._where, exc) from exc
            except TRANSIENT_ERRORS as exc:
                raise unavailable(self._where, exc) from exc
        raise AssertionError("unreachable")

    async def _look_up_once(
        self, lookups: LookupConnection, keys_by_map: Mapping[str, Sequence[str]]
    ) -> dict[str, BatchLookup]:
        physical = {name: await self._physical(name) for name in keys_by_map}
        # No await from here until every command is written: a watermark read found in
        # flight was written before this lookup's reads, and one written here is found by
        # the lookups after it.
        connection = await lookups.connected()
        now = time.monotonic()
        marks: dict[str, Any] = {}
        commands: list[tuple[Any, ...]] = []
        for name in keys_by_map:
            kept = self._fresh_mark(physical[name], now)
            if kept is not None:
                marks[name] = kept[1]
            elif (shared := self._mark_reads.get(physical[name])) and shared[0] is connection:
                marks[name] = shared[1]
            else:
                commands.append(("HGETALL", meta_key(physical[name])))
        for name, keys in keys_by_map.items():
            prefix = entity_key(physical[name], "")  # one call per key slows a batch
            entity_keys = [prefix + k for k in keys]
            if entity_keys:
                commands.append(("GET" if len(keys) == 1 else "MGET", *entity_keys))
        futures = iter([connection.send(*command) for command in commands])
        for name in keys_by_map:
            if name not in marks:
                marks[name] = self._mark_read(connection, physical[name], now, next(futures))
        values = iter(await _replies(list(futures)))
        out = {}
        for name, keys in keys_by_map.items():
            mark = marks[name]
            if isinstance(mark, asyncio.Future):
                mark = await asyncio.shield(mark)
            # GET answers a value, MGET a list of them; no keys, no command.
            entities = list(next(values)) if len(keys) > 1 else [next(values)] if keys else []
            missing = None in entities
            if missing or self._unchecked(physical[name]):
                await self._check_whole(name, physical[name], missing)
            if missing and physical[name] in self._restored:
                read = functools.partial(_read_one_by_one, lookups)
                entities = await _read_again(read, physical[name], keys, entities)
            out[name] = BatchLookup(entities=entities, watermark=mark)
        return out

    def _mark_read(
        self, connection: Replies, physical: str, started: float, reply: asyncio.Future[Any]
    ) -> asyncio.Future[Watermark | None]:
        """The watermark a written ``HGETALL`` answers, shared with the lookups written
        after it on the same connection until it is answered, then kept (``_keep_mark``)."""
        mark: asyncio.Future[Watermark | None] = asyncio.get_running_loop().create_future()

        def answered(done: asyncio.Future[Any]) -> None:
            if self._mark_reads.get(physical, (None, None))[1] is mark:
                del self._mark_reads[physical]
            if done.cancelled():
                mark.cancel()
            elif (exc := done.exception()) is not None:
                mark.set_exception(exc)
                mark.exception()  # retrieved: each lookup sharing it raises it itself
            else:
                raw = done.result()
                it = iter(raw)
                try:
                    value = Watermark.from_hash(
                        raw if isinstance(raw, dict) else dict(zip(it, it, strict=True))
                    )
                except Exception as unreadable:  # the layout's error, raised by each lookup
                    mark.set_exception(unreadable)
                    mark.exception()
                    return
                self._keep_mark(physical, started, value)
                mark.set_result(value)

        reply.add_done_callback(answered)
        self._mark_reads[physical] = (connection, mark)
        return mark

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
            missing = any(entity is None for entity in entities)
            if missing or self._unchecked(physical[name]):
                await self._check_whole(name, physical[name], missing)
            if missing and physical[name] in self._restored:
                entities = await _read_again(self._read_masters, physical[name], keys, entities)
            out[name] = BatchLookup(entities=entities, watermark=marks[name])
        return out

    async def _read_masters(self, names: list[str]) -> list[Any]:
        """Entity keys read on a cluster, each from its master."""
        assert self._masters is not None
        async with self._unavailable_on_connection_errors():
            return list(await self._masters.get(names))

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
        read = self._marker_reads.get(physical)
        if read is None:
            read = asyncio.get_running_loop().create_task(self._read_markers(map_name, physical))
            self._marker_reads[physical] = read
            read.add_done_callback(_retrieved)
        whole, reported = await asyncio.shield(read)
        if whole:
            self._whole.add(physical)
            return
        if physical in self._whole or reported:
            self._restored.add(physical)  # lost here, so its misses are read again once whole
        if missing and (physical in self._whole or reported):
            raise MapRestoring(
                map_name,
                f"map {map_name}: Redis lost its copy, which the materializer is restoring "
                "from Delta and the changelog; retry shortly",
            )

    async def _read_markers(self, map_name: str, physical: str) -> tuple[bool, bool]:
        """Whether every master holds the map's marker, and whether a materializer reports on
        the map. The lookups that found a key missing before this read starts share it (it
        is sent after their reads); those after it start another, so a burst of misses
        costs a read or two, not one each."""
        if self._marker_reads.get(physical) is asyncio.current_task():
            del self._marker_reads[physical]
        marks = list(markers(self._client, physical).values())
        async with (
            self._unavailable_on_connection_errors(),
            self._client.pipeline(transaction=False) as pipe,
        ):
            for key in marks:
                pipe.exists(key)
            pipe.exists(status_key(map_name))
            *found, reported = await pipe.execute()
        return all(found), bool(reported)

    async def last_change_id(self, map_name: str) -> str | None:
        """The newest entry id of the map's change stream (``ChangeStream.last_id``)."""
        return await self._changes.last_id(await self._physical(map_name))

    async def read_changes(self, map_name: str, after: str, count: int) -> ChangeRead:
        """The stream's bounds and its entries after ``after`` (``ChangeStream.read``)."""
        return await self._changes.read(map_name, await self.generation(map_name), after, count)

    async def wait_for_changes(self, map_name: str, after: str, timeout: float) -> None:
        """Until an entry after ``after`` or ``timeout`` (``ChangeStream.wait``)."""
        await self._changes.wait(await self._physical(map_name), after, timeout)

    async def close(self) -> None:
        """Close the pools' connections."""
        if self._lookups is not None:
            self._lookups.close()
        if self._masters is not None:
            await self._masters.close()
        await self._changes.close()
        await close_async(self._client)


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A shared read's failure counts as seen: each of its askers raises it itself."""
    if not task.cancelled():
        task.exception()


async def _replies(futures: list[asyncio.Future[Any]]) -> list[Any]:
    """The replies in order, or the first failure among them (every one awaited)."""
    replies = await settled(futures)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


async def _read_again(
    read: Callable[[list[str]], Awaitable[list[Any]]],
    physical: str,
    keys: Sequence[str],
    entities: list[Any],
) -> list[Any]:
    """The keys found missing, read again after the markers said the copy is whole.

    A map this process saw lost and restored may have been restored between a
    lookup's read and its marker check: the marker goes last, so a read after
    the check sees the whole copy, and a key the first read missed is then
    either there or truly absent. One server or a cluster alike."""
    again = [i for i, entity in enumerate(entities) if entity is None]
    entities = list(entities)
    for i, value in zip(
        again, await read([entity_key(physical, keys[i]) for i in again]), strict=True
    ):
        entities[i] = value
    return entities


async def _read_one_by_one(lookups: LookupConnection, names: list[str]) -> list[Any]:
    """Entity keys read down the lookups' connection on one server, a ``GET`` each."""
    connection = await lookups.connected()
    return list(await _replies([connection.send("GET", name) for name in names]))
