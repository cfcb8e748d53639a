"""``Query`` and ``GetAsOf``: reads of a map's Delta table through delta-rs (no JVM)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from materializer.config import AppConfig
from materializer.v1 import map_service_pb2 as pb


class TableReads:
    """Filtered, paged reads and time travel over the maps' Delta tables."""

    def __init__(self, config: AppConfig) -> None:
        self._config = config

    async def query(
        self, request: pb.QueryRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.QueryResponse]:
        """Pages of matching rows, ordered by key."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Query is not available yet")
        yield pb.QueryResponse()

    async def get_as_of(
        self, request: pb.GetAsOfRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAsOfResponse:
        """One entity at a table version or time."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetAsOf is not available yet")
        return pb.GetAsOfResponse()
