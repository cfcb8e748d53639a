"""``materializer.v1.AdminService``: map status and lag, pause/resume/restart, validation."""

from __future__ import annotations

import grpc

from materializer.config import AppConfig
from materializer.v1 import admin_service_pb2 as pb
from materializer.v1 import admin_service_pb2_grpc as pb_grpc
from query_service.stores.base import MapStore


class AdminServicer(pb_grpc.AdminServiceServicer):
    """Reads what the materializer reports in Redis and writes the control keys it obeys."""

    def __init__(self, config: AppConfig, store: MapStore) -> None:
        self._config = config
        self._store = store

    async def ListMaps(
        self, request: pb.ListMapsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMapsResponse:
        """The declared maps."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "ListMaps is not available yet")
        return pb.ListMapsResponse()
