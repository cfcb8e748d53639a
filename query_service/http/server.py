"""The HTTP/JSON front's aiohttp application, and its listener beside the gRPC server.

aiohttp was measured against Starlette and FastAPI on uvicorn for a bare
lookup-shaped endpoint (docs/decisions/0005-http-front-on-aiohttp.md): it
costs the least CPU per request, and it streams both ways (the enrichment's
NDJSON body in, Server-Sent Events out) on its own server. One middleware
makes every answer that is not a handler's own a JSON error: unknown routes,
wrong methods, bodies over the limit, and anything that escaped (500, logged,
never a stack trace to the client).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable

import grpc
from aiohttp import web

from materializer.config import TlsConfig
from materializer.errors import SetupError
from query_service.http.calls import HttpAbort, error_body, error_response
from query_service.http.endpoints import ENDPOINTS
from query_service.http.openapi import openapi_document
from query_service.http.routes import HttpFront
from query_service.interceptors import INTERNAL_DETAILS
from query_service.transport import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error as ``{"error": {"code", "message"}}`` with its HTTP status."""
    try:
        return await handler(request)
    except HttpAbort as exc:
        return error_response(exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, grpc.StatusCode.INTERNAL)
        message = exc.reason if exc.status != 404 else f"no route {request.method} {request.path}"
        if exc.status == 413:
            message = f"body larger than {MAX_MESSAGE_BYTES} bytes"
        answer = web.Response(
            body=error_body(code.name, message), status=exc.status, content_type="application/json"
        )
        if exc.status == 405:
            answer.headers["Allow"] = exc.headers.get("Allow", "")
        return answer
    except Exception:
        log.exception("HTTP %s %s: unhandled error", request.method, request.path)
        return error_response(grpc.StatusCode.INTERNAL, INTERNAL_DETAILS)


def create_app(front: HttpFront) -> web.Application:
    """The application serving ``ENDPOINTS`` with ``front``'s handlers."""
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_MESSAGE_BYTES)
    for endpoint in ENDPOINTS:
        app.router.add_route(endpoint.method, endpoint.path, front.handler(endpoint))
    return app


def openapi() -> Callable[[], bytes]:
    """The document, built once on first use."""
    built: list[bytes] = []

    def document() -> bytes:
        if not built:
            built.append(openapi_document())
        return built[0]

    return document


def ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """The same certificate (and client CA for mutual TLS) as the gRPC port."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file:
            context.load_verify_locations(tls.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise SetupError(f"query.tls: cannot load the certificate for HTTP: {exc}") from None
    return context


async def start_http(
    app: web.Application, host: str, port: int, tls: TlsConfig | None
) -> tuple[web.AppRunner, int]:
    """Listen on ``host:port`` (0: any free port); the runner to stop and the port taken."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context(tls) if tls else None)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise SetupError(f"HTTP: cannot listen on {host}:{port}: {exc.strerror}") from None
    server = site._server  # noqa: SLF001 - the bound port when 0 was asked
    sockets = getattr(server, "sockets", None) or []
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    return runner, bound
