"""One HTTP request as one call of a servicer method, and a failed call as a JSON error.

The servicers take a gRPC ``ServicerContext`` and use four things of it: the
time left, the caller's metadata, initial metadata sent, and ``abort``.
``HttpContext`` gives them those from the HTTP request, so the handlers run
unchanged, wrapped by the same ``MethodCall`` as on gRPC (authorization,
metrics, error mapping); an abort becomes ``HttpAbort``, which
``error_response`` turns into ``{"error": {"code", "message"}}`` with the
matching HTTP status.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
import orjson
from aiohttp import web

HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 413,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""As Google's HTTP mapping of gRPC codes, but RESOURCE_EXHAUSTED: every such error here is
a request larger than the server allows (413), never a rate limit (429)."""


class HttpAbort(Exception):
    """A call ended with a status: ``code`` and the message the client sees."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_body(code: str, message: str) -> bytes:
    """The JSON of every error answer."""
    return orjson.dumps({"error": {"code": code, "message": message}})


def error_response(code: grpc.StatusCode, message: str) -> web.Response:
    """An error answer with the HTTP status of ``code``; 401 tells how to authenticate."""
    status = HTTP_STATUS.get(code, 500)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return web.Response(
        body=error_body(code.name, message),
        status=status,
        content_type="application/json",
        headers=headers,
    )


class HttpContext:
    """What a servicer method asks of its call, answered from an HTTP request."""

    def __init__(
        self,
        request: web.Request,
        timeout_s: float | None = None,
        on_initial_metadata: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._headers = request.headers
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._on_initial_metadata = on_initial_metadata
        self._code: grpc.StatusCode | None = None

    def time_remaining(self) -> float | None:
        """Seconds before the request's ``timeout_ms`` runs out; None without one."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def invocation_metadata(self) -> Iterable[tuple[str, str]]:
        """The request's headers, lower-cased as gRPC metadata keys are (asked for only
        when a token is checked)."""
        return tuple((k.lower(), v) for k, v in self._headers.items())

    async def send_initial_metadata(self, _: Any) -> None:
        """A stream is positioned: a streamed answer may start (its status is 200 then)."""
        if self._on_initial_metadata is not None:
            await self._on_initial_metadata()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with ``code``: raised to the HTTP handler."""
        self._code = code
        raise HttpAbort(code, details)

    def code(self) -> grpc.StatusCode | None:
        """The code the call was aborted with, if it was."""
        return self._code
