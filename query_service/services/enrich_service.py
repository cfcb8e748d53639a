"""``materializer.v1.EnrichService``: events joined with materialized maps by key."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from materializer.config import AppConfig
from materializer.v1 import enrich_service_pb2 as pb
from materializer.v1 import enrich_service_pb2_grpc as pb_grpc
from query_service.freshness import FreshnessGate
from query_service.stores.base import MapStore


class EnrichServicer(pb_grpc.EnrichServiceServicer):
    """Joins each request's events with map entities, lookups batched per request."""

    def __init__(self, config: AppConfig, store: MapStore, gate: FreshnessGate) -> None:
        self._config = config
        self._store = store
        self._gate = gate

    async def Enrich(
        self,
        request_iterator: AsyncIterator[pb.EnrichRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.EnrichResponse]:
        """Answer each request in order."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Enrich is not available yet")
        yield pb.EnrichResponse()
