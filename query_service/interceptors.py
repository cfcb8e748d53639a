"""The one place where calls are authorized, measured, and exceptions become statuses.

Without it grpc.aio answers an escaped exception with ``UNKNOWN`` and the
exception's text, which tells the client nothing it can act on and may leak
internals. Handlers therefore raise ``QueryServiceError`` subclasses and let
everything else propagate here. Authorization runs inside the same wrapper,
so a refused call is counted and answered like any other error; it checks
the token before the handler runs and the maps each request names (every
request of a stream) before the handler sees it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, NoReturn

import grpc

from materializer.errors import first_line
from query_service.auth import CALLER, OPEN_PREFIXES, Authorizer, Grant, preset_grant
from query_service.errors import InvalidArgument, QueryServiceError, StoreUnavailable
from query_service.metrics import LATENCY, REQUESTS, STORE_ERRORS

log = logging.getLogger(__name__)

INTERNAL_DETAILS = "internal error in the query service (logged on the server)"

Behavior = Callable[[Any, Any], Any]
RequestMaps = Callable[[str, Any], Iterable[str]]
"""The maps a request of a method names (for per-map grants)."""


class _Captured:
    """Stands in for the server while a generated ``add_*Servicer_to_server`` registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, _: object) -> None:
        """The same handlers as ``add_registered_method_handlers`` gets."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.handlers[service] = handlers


def add_wrapped(
    server: grpc.aio.Server,
    add_to_server: Callable[[Any, Any], None],
    servicer: Any,
    authorizer: Authorizer | None = None,
    request_maps: RequestMaps | None = None,
) -> None:
    """Register ``servicer`` (with its generated ``add_*Servicer_to_server``) on ``server``,
    each method wrapped once by ``MethodCall``.

    ``QueryServiceError`` becomes its ``code``, any other exception
    ``INTERNAL``; with an ``authorizer``, every call needs a bearer token
    whose grant covers the method's verb and the request's maps. Works for
    all four RPC kinds and keeps each handler's shape (coroutine or async
    generator), because grpc.aio picks how to drive a handler by inspecting
    it. Aborts a handler made itself, and cancellations, pass through.
    Wrapped at registration rather than by a server interceptor: grpc.aio
    runs an interceptor's coroutine on every call, a noticeable share of a
    lookup's CPU. Health needs no token (``OPEN_PREFIXES``).
    """
    captured = _Captured()
    add_to_server(servicer, captured)
    maps_of = request_maps or (lambda method, request: ())
    for service, handlers in captured.handlers.items():
        wrapped = {
            name: _wrapped(f"/{service}/{name}", handler, authorizer, maps_of)
            for name, handler in handlers.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        server.add_registered_method_handlers(service, wrapped)


def _wrapped(
    method: str,
    handler: grpc.RpcMethodHandler,
    authorizer: Authorizer | None,
    request_maps: RequestMaps,
) -> grpc.RpcMethodHandler:
    call = MethodCall(method, authorizer, request_maps)
    for kind, factory in _FACTORIES.items():
        behavior = getattr(handler, kind)
        if behavior is not None:
            return factory(
                call.wrap(behavior, streaming_requests=kind.startswith("stream_")),
                request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
    return handler


class _Undecodable:
    """A request body that is not the method's message (bad wire data, invalid UTF-8)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """Parse failures become a value the handler wrapper answers with INVALID_ARGUMENT;
    left to grpc, they would be INTERNAL with no word on what was wrong."""
    if deserialize is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as exc:  # protobuf's DecodeError and friends
            return _Undecodable(first_line(exc))

    return parse


def _decoded(request: Any) -> Any:
    if isinstance(request, _Undecodable):
        raise InvalidArgument(f"request: not a valid message ({request.reason})")
    return request


_FACTORIES: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


class MethodCall:
    """Per method: authorization before the handler, metrics and status mapping after it.

    The HTTP front (``query_service.http``) wraps the same servicer methods
    with it, through a context of its own, so both transports authorize,
    count and map errors in this one place.
    """

    def __init__(
        self, method: str, authorizer: Authorizer | None, request_maps: RequestMaps
    ) -> None:
        self.method = method
        self.short = method.rsplit("/", 1)[-1]
        self._authorizer = None if method.startswith(OPEN_PREFIXES) else authorizer
        self._request_maps = request_maps
        self._counters: dict[grpc.StatusCode, Any] = {}
        self._latency = LATENCY.labels(self.short)

    def _authorize(self, context: grpc.aio.ServicerContext) -> Grant | None:
        if self._authorizer is None:
            return None
        grant = preset_grant(context) or self._authorizer.authenticate(
            context.invocation_metadata()
        )
        self._authorizer.check_verb(grant, self.method)
        CALLER.set(grant.name)
        return grant

    def _check(self, grant: Grant | None, request: Any) -> None:
        if grant is not None:
            Authorizer.check_maps(grant, self._request_maps(self.method, request))

    def _checked_stream(self, grant: Grant | None, requests: AsyncIterator[Any]) -> Any:
        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                self._check(grant, _decoded(request))
                yield request

        return checked()

    def _prepare(self, request: Any, context: Any, streaming_requests: bool) -> Any:
        grant = self._authorize(context)
        if streaming_requests:
            return self._checked_stream(grant, request)
        self._check(grant, _decoded(request))
        return request

    def wrap(self, behavior: Behavior, *, streaming_requests: bool) -> Behavior:
        """The behavior with authorization, metrics and error mapping around it."""
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                started = time.perf_counter()
                try:
                    request = self._prepare(request, context, streaming_requests)
                    async for response in behavior(request, context):
                        yield response
                except BaseException as exc:
                    # Counted before the status leaves: a client that saw it sees it counted.
                    self._measure(started, _code_of(exc, context))
                    await self._fail(context, exc)
                self._measure(started, grpc.StatusCode.OK)

            return stream

        if inspect.iscoroutinefunction(behavior):

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                started = time.perf_counter()
                try:
                    request = self._prepare(request, context, streaming_requests)
                    response = await behavior(request, context)
                except BaseException as exc:
                    # Counted before the status leaves: a client that saw it sees it counted.
                    self._measure(started, _code_of(exc, context))
                    await self._fail(context, exc)
                self._measure(started, grpc.StatusCode.OK)
                return response

            return unary

        # Every handler in this service is async. grpc.aio would run a synchronous
        # one on a thread pool, where the context cannot be awaited; such a handler
        # must map its own errors, so it is left as it is.
        return behavior

    async def _fail(self, context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
        if isinstance(exc, grpc.aio.AbortError | asyncio.CancelledError) or not isinstance(
            exc, Exception
        ):
            raise exc
        if isinstance(exc, QueryServiceError):
            if isinstance(exc, StoreUnavailable):
                STORE_ERRORS.labels(self.short).inc()
            log.debug("%s: %s %s", self.method, exc.code.name, exc)
            await context.abort(exc.code, str(exc))
        log.error("%s: unhandled %s", self.method, type(exc).__name__, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_DETAILS)
        raise AssertionError("unreachable: context.abort raises")

    def _measure(self, started: float, code: grpc.StatusCode) -> None:
        # The labelled children are looked up once: ``labels()`` takes a lock and builds
        # a key on every call, a measurable share of a lookup's CPU.
        counter = self._counters.get(code)
        if counter is None:
            counter = self._counters[code] = REQUESTS.labels(self.short, code.name)
        counter.inc()
        self._latency.observe(time.perf_counter() - started)


def _code_of(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """The status a call ends with, for metrics."""
    if isinstance(exc, QueryServiceError):
        return exc.code
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED
    if isinstance(exc, grpc.aio.AbortError):
        code = context.code()
        return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.INTERNAL
