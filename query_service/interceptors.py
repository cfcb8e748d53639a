"""The one place where exceptions become gRPC statuses.

Without it grpc.aio answers an escaped exception with ``UNKNOWN`` and the
exception's text, which tells the client nothing it can act on and may leak
internals. Handlers therefore raise ``QueryServiceError`` subclasses and let
everything else propagate here.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from query_service.errors import QueryServiceError

log = logging.getLogger(__name__)

INTERNAL_DETAILS = "internal error in the query service (logged on the server)"

Behavior = Callable[[Any, Any], Any]


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Map ``QueryServiceError`` to its ``code`` and any other exception to ``INTERNAL``.

    Works for all four RPC kinds and keeps each handler's shape (coroutine or
    async generator), because grpc.aio picks how to drive a handler by
    inspecting it. Aborts a handler made itself, and cancellations, pass
    through untouched.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Wrap the behaviour of the handler the rest of the chain resolves."""
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED itself
            return None
        method: str = handler_call_details.method
        for kind, factory in _FACTORIES.items():
            behavior = getattr(handler, kind)
            if behavior is not None:
                return factory(
                    _wrap(behavior, method),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler


_FACTORIES: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


async def _abort(context: grpc.aio.ServicerContext, exc: Exception, method: str) -> NoReturn:
    if isinstance(exc, QueryServiceError):
        log.debug("%s: %s %s", method, exc.code.name, exc)
        await context.abort(exc.code, str(exc))
    log.error("%s: unhandled %s", method, type(exc).__name__, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_DETAILS)
    raise AssertionError("unreachable: context.abort raises")


def _wrap(behavior: Behavior, method: str) -> Behavior:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for response in behavior(request, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await _abort(context, exc, method)

        return stream

    if inspect.iscoroutinefunction(behavior):

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await _abort(context, exc, method)

        return call

    # Every handler in this service is async. grpc.aio would run a synchronous
    # one on a thread pool, where the context cannot be awaited; such a handler
    # must map its own errors, so it is left as it is.
    return behavior
