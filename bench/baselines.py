"""The query benchmark's baselines, each run as its own process: a bare gRPC echo server
and a bare aiohttp server, answering as many bytes as the query service does and nothing
else."""

from __future__ import annotations

import asyncio
import signal

import grpc

from query_service.event_loop import EventLoop, loop_factory, run

ECHO_SERVICE = "materializer.bench.Echo"


ECHO = f"/{ECHO_SERVICE}/Echo"


def serve_echo(port: int, response_bytes: int, event_loop: EventLoop) -> None:
    """A bare grpc.aio server with one unary method and no serializers, until SIGTERM.

    Generic handlers with raw bytes need no generated code; the answer is a
    fixed payload of a GetResponse's size, so the baseline moves the same bytes
    as Get and does nothing else: no protobuf, no interceptor, no store. It runs
    on the query service's event loop, so the ratio compares the service with
    the stack it rides on.
    """
    response = b"\x00" * response_bytes

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return response

    async def serve() -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            ECHO_SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        )
        server.add_generic_rpc_handlers((handler,))
        if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
            raise SystemExit(f"echo server: cannot listen on port {port}")
        await server.start()
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        await stopping.wait()
        await server.stop(0)

    run(serve(), event_loop)


def serve_bare_http(port: int, body_bytes: int, event_loop: EventLoop) -> None:
    """A bare aiohttp server answering the entity route with a fixed JSON body of the HTTP
    front's answer size, until SIGTERM: the HTTP baseline, as ``serve_echo`` is gRPC's."""
    from aiohttp import web

    body = b'{"pad":"' + b"x" * max(0, body_bytes - 10) + b'"}'

    async def entity(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/maps/{map}/entities/{key}", entity)
    loop = loop_factory(event_loop)()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=loop)
