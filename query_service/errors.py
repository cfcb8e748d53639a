"""Errors the query service raises on purpose; each one owns its gRPC status code.

Handlers raise these and never catch broadly: the one wrapper of every
servicer method (``query_service.interceptors``) turns them into a status with their message,
and anything else into ``INTERNAL`` — never ``UNKNOWN``. The message goes to
the client as the status details, so it must help the caller and must not leak
secrets (a Redis URL may hold a password: name the host, never the URL).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import grpc


class QueryServiceError(Exception):
    """Root of the query service's errors; ``code`` is the status the client sees."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL


class MapNotFound(QueryServiceError):
    """The request names a map the configuration does not declare."""

    code = grpc.StatusCode.NOT_FOUND

    def __init__(self, map_name: str, known: Iterable[str]) -> None:
        self.map_name = map_name
        self.known = sorted(known)
        listed = ", ".join(self.known) or "none"
        super().__init__(f"no such map {map_name!r} (known maps: {listed})")


class NotFound(QueryServiceError):
    """The request names something of a map that does not exist (yet)."""

    code = grpc.StatusCode.NOT_FOUND


class InvalidArgument(QueryServiceError):
    """A request field is malformed; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class StoreUnavailable(QueryServiceError):
    """The backing store cannot be reached; the call may succeed if retried."""

    code = grpc.StatusCode.UNAVAILABLE


class MapRestoring(StoreUnavailable):
    """Redis lost the map's copy, which its run is restoring: a key not written back yet
    may exist. Lookups answer from the map's Delta table meanwhile
    (``tables.fallback``); other reads retry."""

    def __init__(self, map_name: str, message: str) -> None:
        super().__init__(message)
        self.map_name = map_name


class ResourceExhausted(QueryServiceError):
    """A request asks for more than the server allows at once (keys, rows, bytes)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(QueryServiceError):
    """A wait for freshness outlived the call's deadline; the map has not caught up yet."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class OutOfRange(QueryServiceError):
    """A position (change id, table version) is no longer, or not yet, available."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unauthenticated(QueryServiceError):
    """No bearer token, or one the server does not know."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(QueryServiceError):
    """A known token that is not allowed this map or verb."""

    code = grpc.StatusCode.PERMISSION_DENIED


class FailedPrecondition(QueryServiceError):
    """The request cannot apply to the thing as it stands; the message names the way out."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(QueryServiceError):
    """A create of something that exists already."""

    code = grpc.StatusCode.ALREADY_EXISTS
