"""``materializer.v1.MapService``: lookups, batch lookups and change streams of maps.

``Query`` reads through a map's index in Redis when one serves its filter
(``IndexQueries``), else its Delta table; ``GetAsOf`` reads the Delta tables. Both
table reads are delegated to ``TableReads``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

import grpc
from deltalake.exceptions import DeltaError

from materializer.catalog.live import LiveMaps, as_live
from materializer.config import AppConfig
from materializer.contract.redis_layout import RESERVED_KEYS
from materializer.contract.watermark import Watermark
from materializer.v1 import common_pb2 as common
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.change_stream import ChangeCursor
from query_service.errors import (
    InvalidArgument,
    MapNotFound,
    MapRestoring,
    ResourceExhausted,
)
from query_service.freshness import FreshnessGate, covers, watermark_to_proto
from query_service.indexes.queries import IndexQueries
from query_service.near_cache import NearCaches
from query_service.services.table_reads import TableReads
from query_service.stores.base import BatchLookup, Change, MapStore
from query_service.stores.delta import TableNotFound
from query_service.tables.entity_filter import ChosenChanges, entity_filter
from query_service.tables.fallback import TableFallback, TableLookup

log = logging.getLogger(__name__)

MAX_KEY_BYTES = 4096
_SURELY_SHORT = MAX_KEY_BYTES // 4
"""Characters a key may have and stay within ``MAX_KEY_BYTES`` whatever they are (UTF-8
takes at most four bytes a character)."""
WATCH_BATCH = 1000
"""Changes read per round trip (and sent per message) by a Watch without entities."""
WATCH_BATCH_WITH_ENTITIES = 100
"""The same with entities, which may be large: keeps messages well under the send limit."""


class MapServicer(pb_grpc.MapServiceServicer):
    """Validates requests against the configured maps, then reads the store.

    Raises ``QueryServiceError`` subclasses and lets the wrapper of every servicer method
    turn them into statuses; it never catches broadly.
    """

    def __init__(
        self,
        config: AppConfig | LiveMaps,
        store: MapStore,
        gate: FreshnessGate,
        tables: TableReads,
        near_caches: NearCaches | None = None,
        indexes: IndexQueries | None = None,
        fallback: TableFallback | None = None,
    ) -> None:
        """``fallback``: lookups of a map Redis lost read its table while it is restored;
        without, they are ``UNAVAILABLE`` until the copy is whole."""
        self._live = as_live(config)
        self._max_keys = self._live.config.query.max_batch_keys
        self._store = store
        self._gate = gate
        self._tables = tables
        self._reads = near_caches if near_caches is not None else NearCaches(store, {})
        self._indexes = indexes
        self._fallback = fallback
        self._protos: dict[str, tuple[Watermark, common.Watermark]] = {}
        """Per map, the last watermark answered and its wire form: lookups share one."""

    async def Get(
        self, request: pb.GetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetResponse:
        """The entity under ``request.key`` and the map's watermark."""
        self._check_map(request.map)
        _check_key(request.key)
        wanted = request.freshness.min_offsets
        await self._gate.wait(request.map, wanted, context.time_remaining())
        try:
            lookup = await self._reads.get(request.map, request.key, wanted)
        except MapRestoring as restoring:
            read = await self._from_table(restoring, [request.key], wanted)
            response = pb.GetResponse(
                found=read.entities[0] is not None,
                entity=read.entities[0] or b"",
                from_table=True,
                table_version=read.version,
            )
            if read.watermark is not None:
                response.watermark.CopyFrom(self._proto(request.map, read.watermark))
            return response
        found = lookup.entity is not None
        if lookup.watermark is None:
            return pb.GetResponse(found=found, entity=lookup.entity or b"")
        mark = self._proto(request.map, lookup.watermark)
        return pb.GetResponse(found=found, entity=lookup.entity or b"", watermark=mark)

    def _proto(self, map_name: str, watermark: Watermark) -> common.Watermark:
        """``watermark_to_proto``, once per watermark the store reads."""
        kept = self._protos.get(map_name)
        if kept is not None and kept[0] is watermark:
            return kept[1]
        message = watermark_to_proto(watermark)
        self._protos[map_name] = (watermark, message)
        return message

    async def BatchGet(
        self, request: pb.BatchGetRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchGetResponse:
        """One entry per requested key, in request order, and a watermark below them all."""
        self._check_map(request.map)
        self._check_keys(request.keys)
        wanted = request.freshness.min_offsets
        await self._gate.wait(request.map, wanted, context.time_remaining())
        response = pb.BatchGetResponse()
        try:
            batch = await self._reads.get_many(request.map, request.keys, wanted)
        except MapRestoring as restoring:
            read = await self._from_table(restoring, request.keys, wanted)
            batch = BatchLookup(read.entities, read.watermark)
            response.from_table, response.table_version = True, read.version
        # Entries built in place: a list of entries given to the constructor is copied into
        # the response, which builds every entry twice.
        add = response.entries.add
        for key, entity in zip(request.keys, batch.entities, strict=True):
            if entity is None:
                add(key=key)
            else:
                add(key=key, found=True, entity=entity)
        if batch.watermark is not None:
            response.watermark.CopyFrom(self._proto(request.map, batch.watermark))
        return response

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchResponse]:
        """The map's changes from a position on, one message per read, until cancelled.

        Initial metadata goes out once the position is fixed: a client that
        waits for it knows every later change will reach it. Changes trimmed
        before this call read them (a resume id older than the oldest
        retained, or a watcher that fell behind the cap) end it with
        OUT_OF_RANGE, never with a silent gap. Entities are read from Redis,
        never from the near cache, which may lag the stream.
        """
        self._check_map(request.map)
        self._check_keys(request.keys)
        only = frozenset(request.keys)
        generation = await self._store.generation(request.map)
        matching = await entity_filter(request, self._tables.snapshots, generation)
        chosen = None if matching is None else ChosenChanges(matching, request.include_left)
        batch = WATCH_BATCH_WITH_ENTITIES if request.include_entities else WATCH_BATCH
        cursor = ChangeCursor(self._store, request.map, batch=batch)
        await cursor.open(request.after_change_id)
        await context.send_initial_metadata(())
        while True:
            changes = [c for c in await cursor.next() if not only or c.key in only]
            if not changes:
                continue
            if chosen is None:
                yield await self._watch_response(request.map, changes, request.include_entities)
                continue
            entities = await self._entities(request.map, changes)
            sent = await chosen.pick(changes, entities)
            if sent:
                yield _changes(sent, entities if request.include_entities else {})

    async def Query(
        self, request: pb.QueryRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.QueryResponse]:
        """Rows of the map matching a filter, in pages: through an index of its Redis copy
        when one serves the filter (``query_service.indexes``), else from its Delta table."""
        self._check_map(request.map)

        def table() -> AsyncIterator[pb.QueryResponse]:
            return self._tables.query(request, context)

        pages = (
            None if self._indexes is None else await self._indexes.query(request, context, table)
        )
        async for page in pages if pages is not None else table():
            yield page

    async def GetAsOf(
        self, request: pb.GetAsOfRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAsOfResponse:
        """One entity as the Delta table held it at a version or time."""
        self._check_map(request.map)
        _check_key(request.key)
        return await self._tables.get_as_of(request, context)

    async def GetSchema(
        self, request: pb.GetSchemaRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSchemaResponse:
        """The map's fields as its Delta table holds them, and when each came."""
        self._check_map(request.map)
        return await self._tables.schema(request)

    async def _from_table(
        self,
        restoring: MapRestoring,
        keys: Sequence[str],
        wanted: Sequence[common.PartitionOffset],
    ) -> TableLookup:
        """The keys' entities from the map's table while Redis restores its copy; the
        restore's ``UNAVAILABLE`` when the table does not reflect ``wanted`` (the caller
        retries until the copy is whole) or the map has no table to answer from."""
        if self._fallback is None:
            raise restoring
        name = restoring.map_name
        generation = await self._store.generation(name)
        try:
            read = await self._fallback.get_many(name, generation, keys)
        except TableNotFound:
            raise restoring from None
        except (OSError, MemoryError, DeltaError) as exc:  # the table cannot be read now
            log.warning("map %s: its table cannot answer lookups meanwhile: %s", name, exc)
            raise restoring from exc
        if wanted and not covers(read.watermark, wanted):
            raise restoring
        return read

    def _check_map(self, name: str) -> None:
        maps = self._live.config.maps
        if name not in maps:
            raise MapNotFound(name, maps)

    def _check_keys(self, keys: Sequence[str]) -> None:
        """The count first, so an oversized request is refused before its keys are looked at."""
        if len(keys) > self._max_keys:
            raise ResourceExhausted(
                f"keys: {len(keys)} keys, at most {self._max_keys} per call (query.max_batch_keys)"
            )
        # A message naming its index is made only for a key in doubt: a batch's keys are
        # nearly always plainly fine, and a message per key cost a large share of a BatchGet.
        for i, key in enumerate(keys):
            if not key or len(key) > _SURELY_SHORT or key in RESERVED_KEYS:
                _check_key(key, f"keys[{i}]")

    async def _watch_response(
        self, map_name: str, changes: list[Change], include_entities: bool
    ) -> pb.WatchResponse:
        entities = await self._entities(map_name, changes) if include_entities else {}
        return _changes([(c, False) for c in changes], entities)

    async def _entities(self, map_name: str, changes: list[Change]) -> dict[str, bytes | None]:
        """The entities the upserts among ``changes`` wrote, as Redis holds them now."""
        upserted = list(dict.fromkeys(c.key for c in changes if not c.deleted))
        if not upserted:
            return {}
        batch = await self._store.get_many(map_name, upserted)
        return dict(zip(upserted, batch.entities, strict=True))


def _changes(
    changes: list[tuple[Change, bool]], entities: dict[str, bytes | None]
) -> pb.WatchResponse:
    """The changes' message: each with its entity when ``entities`` holds it, and whether
    it is the one after which its entity left the stream's filter."""
    return pb.WatchResponse(
        changes=[
            pb.Change(
                change_id=c.change_id,
                key=c.key,
                op=_operation(c),
                batch_id=c.batch_id,
                entity=entities.get(c.key) or b"",
                left=left,
            )
            for c, left in changes
        ]
    )


def _operation(change: Change) -> pb.Change.Operation:
    if change.expired:
        return pb.Change.EXPIRE
    return pb.Change.DELETE if change.deleted else pb.Change.UPSERT


def _check_key(key: str, field: str = "key") -> None:
    if not key:
        raise InvalidArgument(f"{field}: must not be empty")
    size = len(key.encode())
    if size > MAX_KEY_BYTES:
        raise InvalidArgument(f"{field}: {size} bytes, at most {MAX_KEY_BYTES} allowed")
    if key in RESERVED_KEYS:
        raise InvalidArgument(f"{field}: {key!r} is reserved by the map's layout")
