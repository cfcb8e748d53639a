"""``materializer.v1.MapService``: lookups in materialized maps."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from materializer.config import AppConfig
from materializer.layout import RESERVED_KEYS, Watermark
from materializer.v1 import common_pb2 as common
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.errors import InvalidArgument, MapNotFound
from query_service.freshness import FreshnessGate
from query_service.services.table_reads import TableReads
from query_service.stores.base import MapStore

MAX_KEY_BYTES = 4096


class MapServicer(pb_grpc.MapServiceServicer):
    """Validates requests against the configured maps, then reads the store.

    Raises ``QueryServiceError`` subclasses and lets the server's interceptor
    turn them into statuses; it never catches broadly.
    """

    def __init__(
        self, config: AppConfig, store: MapStore, gate: FreshnessGate, tables: TableReads
    ) -> None:
        self._config = config
        self._maps = frozenset(config.maps)
        self._store = store
        self._gate = gate
        self._tables = tables

    async def Get(
        self, request: pb.GetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetResponse:
        """The entity under ``request.key`` and the map's watermark."""
        self._check_map(request.map)
        _check_key(request.key)
        await self._gate.wait(request.map, request.freshness.min_offsets, context.time_remaining())
        lookup = await self._store.get_with_watermark(request.map, request.key)
        response = pb.GetResponse(found=lookup.entity is not None, entity=lookup.entity or b"")
        if lookup.watermark is not None:
            response.watermark.CopyFrom(watermark_to_proto(lookup.watermark))
        return response

    async def Query(
        self, request: pb.QueryRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.QueryResponse]:
        """Rows of the map's Delta table matching a filter, in pages."""
        self._check_map(request.map)
        async for page in self._tables.query(request, context):
            yield page

    async def GetAsOf(
        self, request: pb.GetAsOfRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAsOfResponse:
        """One entity as the Delta table held it at a version or time."""
        self._check_map(request.map)
        _check_key(request.key)
        return await self._tables.get_as_of(request, context)

    def _check_map(self, name: str) -> None:
        if name not in self._maps:
            raise MapNotFound(name, self._maps)


def _check_key(key: str) -> None:
    if not key:
        raise InvalidArgument("key: must not be empty")
    size = len(key.encode())
    if size > MAX_KEY_BYTES:
        raise InvalidArgument(f"key: {size} bytes, at most {MAX_KEY_BYTES} allowed")
    if key in RESERVED_KEYS:
        raise InvalidArgument(f"key: {key!r} is reserved by the map's layout")


def watermark_to_proto(watermark: Watermark) -> common.Watermark:
    """The wire form of a watermark: offsets ordered by topic, then partition.

    ``updated_at_ms`` of 0 means the writer recorded no time; ``updated_at``
    then stays unset rather than claiming 1970.
    """
    message = common.Watermark(
        batch_id=watermark.batch_id,
        offsets=[
            common.PartitionOffset(topic=topic, partition=partition, offset=offset)
            for topic, partitions in sorted(watermark.offsets.items())
            for partition, offset in sorted(partitions.items())
        ],
    )
    if watermark.updated_at_ms:
        message.updated_at.FromMilliseconds(watermark.updated_at_ms)
    return message
