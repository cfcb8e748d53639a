"""AdminService called the way a client calls it, against a query service in this process."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from materializer.config import AppConfig
from materializer.v1 import admin_service_pb2_grpc as pb_grpc
from query_service.server import create_server
from query_service.stores.redis import RedisMapStore
from tests.helpers.query_redis import HANG_SECONDS, hang_report

T = TypeVar("T")


def admin(config: AppConfig, body: Callable[[pb_grpc.AdminServiceStub], Awaitable[T]]) -> T:
    """Run ``body`` against a freshly started server on a real channel."""

    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> T:
        loops.append(asyncio.get_running_loop())
        store = RedisMapStore.from_url(config.redis.url)
        server, port = await create_server(config, store=store)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                return await body(pb_grpc.AdminServiceStub(channel))
        finally:
            await server.stop(None)
            await store.close()

    with hang_report(HANG_SECONDS, loops):
        return asyncio.run(main())


def call(config: AppConfig, method: str, request: Any) -> Any:
    async def body(stub: pb_grpc.AdminServiceStub) -> Any:
        return await getattr(stub, method)(request, timeout=30)

    return admin(config, body)
