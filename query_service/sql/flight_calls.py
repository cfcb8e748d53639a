"""Each call of the Flight SQL port: its token checked, counted, and its errors turned
into Flight's.

Every call, Flight's handshake included, carries ``authorization: Bearer <token>`` (as
ADBC's and the JDBC driver's Flight SQL drivers send it) and needs a grant of the verb
``query``; without ``query.auth`` the port is open. Calls are counted in the metrics the
gRPC port's calls are counted in (``query_service.metrics``), by Flight method.

pyarrow.flight sends a clean message with only some gRPC codes (INVALID_ARGUMENT and
NOT_FOUND come with a Python traceback appended), so the service's codes map onto
Flight's errors (``FLIGHT_ERRORS``); every error carries the service's own code in the
``x-materializer-status`` trailer, which ADBC shows among an error's details, and at the
head of its message when the gRPC code differs. A handler never lets a traceback out:
anything unexpected is logged and answered INTERNAL.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pyarrow.flight as fl

from query_service.auth import Authorizer, Grant
from query_service.errors import PermissionDenied, QueryServiceError, StoreUnavailable
from query_service.metrics import LATENCY, REQUESTS

log = logging.getLogger(__name__)
T = TypeVar("T")

VERB = "query"
"""The grant every call of the port needs (``query_service.auth``)."""
STATUS_TRAILER = "x-materializer-status"
"""The service's status code of a failed call (``NOT_FOUND``), beside Flight's."""
SERVICE = "/arrow.flight.protocol.FlightService/"
"""How the metrics name the port's methods (``…/GetFlightInfo``)."""
STOPPING = "the query service is stopping"
INTERNAL = "internal error in the query service (logged on the server)"
FLIGHT_ERRORS: dict[grpc.StatusCode, type[fl.FlightError]] = {
    grpc.StatusCode.DEADLINE_EXCEEDED: fl.FlightTimedOutError,
    grpc.StatusCode.UNAUTHENTICATED: fl.FlightUnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: fl.FlightUnauthorizedError,
    grpc.StatusCode.UNAVAILABLE: fl.FlightUnavailableError,
    # Arrow's own clients read RESOURCE_EXHAUSTED as Unavailable: busy, or too big.
    grpc.StatusCode.RESOURCE_EXHAUSTED: fl.FlightUnavailableError,
    grpc.StatusCode.CANCELLED: fl.FlightCancelledError,
    grpc.StatusCode.INTERNAL: fl.FlightInternalError,
}
"""Flight's error for each of the service's codes; any other is ``FlightServerError``
(gRPC's UNKNOWN). A message whose gRPC code is not the service's is headed by the
service's (``INVALID_ARGUMENT: …``, ``RESOURCE_EXHAUSTED: …``)."""
_RENAMED = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})
_MIDDLEWARE = "materializer"


def flight_error(
    exc: QueryServiceError, context: fl.ServerCallContext | None = None
) -> fl.FlightError:
    """The Flight error a client gets for ``exc``; with the call's ``context``, the
    service's code also goes in the trailer and the call's metrics."""
    name = exc.code.name
    if context is not None:
        call = context.get_middleware(_MIDDLEWARE)
        if isinstance(call, Call):
            call.code = name
        try:
            context.add_trailer(STATUS_TRAILER, name)
        except Exception:  # noqa: BLE001 - the trailer is a courtesy; the message carries the code
            log.debug("could not add the status trailer", exc_info=True)
    kind = FLIGHT_ERRORS.get(exc.code, fl.FlightServerError)
    lossy = kind is fl.FlightServerError or exc.code in _RENAMED
    return kind(f"{name}: {exc}" if lossy else str(exc))


def answered(handler: Callable[..., T]) -> Callable[..., T]:
    """A Flight handler (``(self, context, …)``) whose service errors reach the client as
    Flight errors, and whose unexpected ones as INTERNAL, logged here."""

    @functools.wraps(handler)
    def wrapped(self: Any, context: fl.ServerCallContext, *args: Any) -> T:
        try:
            return handler(self, context, *args)
        except fl.FlightError:
            raise
        except QueryServiceError as exc:
            raise flight_error(exc, context) from None
        except Exception:
            log.exception("Arrow Flight SQL %s failed", handler.__name__)
            raise flight_error(QueryServiceError(INTERNAL), context) from None

    return wrapped


def grant_of(context: fl.ServerCallContext) -> Grant | None:
    """The grant of the call's token; ``None`` when the port is open."""
    call = context.get_middleware(_MIDDLEWARE)
    return call.grant if isinstance(call, Call) else None


class Call(fl.ServerMiddleware):  # type: ignore[misc]
    """One call: the caller's grant, and what its metrics need."""

    def __init__(self, calls: Calls, method: str, grant: Grant | None) -> None:
        self.grant = grant
        self.code = "OK"
        """The service's code of the call's error, once ``flight_error`` made one."""
        self._calls = calls
        self._method = method
        self._started = time.perf_counter()

    def call_completed(self, exception: BaseException | None) -> None:
        """Count the call, and let ``Calls`` know it ended."""
        code = "OK" if exception is None else (self.code if self.code != "OK" else "UNKNOWN")
        REQUESTS.labels(self._method, code).inc()
        LATENCY.labels(self._method).observe(time.perf_counter() - self._started)
        self._calls.ended()


class Calls(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    """Checks each call's bearer token, refuses calls once the port is stopping, and
    counts the calls running (from the Flight server's threads)."""

    def __init__(self, authorizer: Authorizer | None) -> None:
        self._authorizer = authorizer
        self._lock = threading.Lock()
        self.running = 0
        self.stopping = False

    def middleware(self) -> dict[str, fl.ServerMiddlewareFactory]:
        """``FlightServerBase``'s ``middleware`` argument."""
        return {_MIDDLEWARE: self}

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[Any]]) -> Call:
        """The call's grant, or the call refused (UNAUTHENTICATED, PERMISSION_DENIED)."""
        method = SERVICE + "".join(w.capitalize() for w in info.method.name.split("_"))
        try:
            if self.stopping:
                raise StoreUnavailable(STOPPING)
            grant = None if self._authorizer is None else self._grant(headers)
        except QueryServiceError as exc:
            REQUESTS.labels(method, exc.code.name).inc()
            raise flight_error(exc) from None
        with self._lock:
            self.running += 1
        return Call(self, method, grant)

    def _grant(self, headers: dict[str, list[Any]]) -> Grant:
        assert self._authorizer is not None
        grant = self._authorizer.authenticate(
            (key.lower(), value) for key, values in headers.items() for value in values
        )
        if not grant.allows_verb(VERB):
            raise PermissionDenied(f"token {grant.name!r} may not run SQL (the verb {VERB!r})")
        return grant

    def ended(self) -> None:
        """One call less running."""
        with self._lock:
            self.running -= 1


class Handshake(fl.ServerAuthHandler):  # type: ignore[misc]
    """Flight's own handshake, which the JDBC driver makes before its first call. It has
    nothing to exchange: the bearer token travels in the ``authorization`` header of every
    call, the handshake's included, and ``Calls`` checks it there."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        """Accept: the call's header was checked already."""

    def is_valid(self, token: bytes) -> bytes:
        """Let every call through to its handler: ``Calls`` decided already."""
        return b""
