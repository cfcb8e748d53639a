"""``materializer.v1.MapService``: lookups in materialized maps."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from materializer.layout import RESERVED_KEYS, Watermark
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from query_service.errors import InvalidArgument, MapNotFound
from query_service.stores.base import MapStore

MAX_KEY_BYTES = 4096


class MapServicer(pb_grpc.MapServiceServicer):
    """Validates requests against the configured maps, then reads the store.

    Raises ``QueryServiceError`` subclasses and lets the server's interceptor
    turn them into statuses; it never catches broadly.
    """

    def __init__(self, maps: Iterable[str], store: MapStore) -> None:
        self._maps = frozenset(maps)
        self._store = store

    async def Get(
        self, request: pb.GetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetResponse:
        """The entity under ``request.key`` and the map's watermark."""
        self._check_map(request.map)
        _check_key(request.key)
        lookup = await self._store.get_with_watermark(request.map, request.key)
        response = pb.GetResponse(found=lookup.entity is not None, entity=lookup.entity or b"")
        if lookup.watermark is not None:
            response.watermark.CopyFrom(watermark_to_proto(lookup.watermark))
        return response

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


def watermark_to_proto(watermark: Watermark) -> pb.Watermark:
    """The wire form of a watermark: offsets ordered by topic, then partition.

    ``updated_at_ms`` of 0 means the writer recorded no time; ``updated_at``
    then stays unset rather than claiming 1970.
    """
    message = pb.Watermark(
        batch_id=watermark.batch_id,
        offsets=[
            pb.PartitionOffset(topic=topic, partition=partition, offset=offset)
            for topic, partitions in sorted(watermark.offsets.items())
            for partition, offset in sorted(partitions.items())
        ],
    )
    if watermark.updated_at_ms:
        message.updated_at.FromMilliseconds(watermark.updated_at_ms)
    return message
