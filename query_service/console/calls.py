"""The servicer methods a console page calls, as the logged-in token.

Each is wrapped by the same ``MethodCall`` as gRPC and HTTP/JSON: the verb and map
checks, the metrics and the status mapping live in one place for every front. A
console call carries the grant its session resolved at login instead of a token
(``auth.preset_grant``); a refusal comes back as ``HttpAbort`` with its gRPC code.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import grpc
from aiohttp import web

from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import sql_service_pb2 as sql_pb
from query_service.auth import Authorizer, Grant, GrantedContext
from query_service.http.calls import HttpAbort, HttpContext
from query_service.http.endpoints import ADMIN_RPC, MAPS_RPC, SQL_RPC
from query_service.interceptors import MethodCall, RequestMaps
from query_service.services.admin_service import AdminServicer
from query_service.services.map_service import MapServicer
from query_service.services.sql_service import SqlServicer
from query_service.sql.executor import Answer

TIMEOUT_S = 10.0
"""A page waits this long for any one call: a page that hangs helps no operator."""


class ConsoleContext(HttpContext, GrantedContext):
    """An HTTP request's context carrying its session's grant (None: auth is off)."""

    def __init__(
        self,
        request: web.Request,
        grant: Grant | None,
        timeout_s: float | None,
        on_opened: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(request, timeout_s, on_opened)
        self.grant = grant


class ConsoleCalls:
    """The read and control methods behind the pages."""

    def __init__(
        self,
        maps: MapServicer,
        admin: AdminServicer,
        authorizer: Authorizer | None,
        request_maps: RequestMaps,
        sql: SqlServicer | None = None,
    ) -> None:
        def call(method: str, behavior: Any) -> Any:
            return MethodCall(method, authorizer, request_maps).wrap(
                behavior, streaming_requests=False
            )

        self._methods: dict[str, Any] = {
            name: call(rpc + name, getattr(servicer, name))
            for rpc, servicer, names in (
                (MAPS_RPC, maps, ("Get", "BatchGet", "Query", "GetAsOf", "Watch")),
                (
                    ADMIN_RPC,
                    admin,
                    (
                        "ListMaps",
                        "GetStatus",
                        "Pause",
                        "Resume",
                        "Restart",
                        "ValidateConfig",
                        "CreateMap",
                        "GetMapConfig",
                        "PutMapConfig",
                        "DeleteMap",
                        "StartOperation",
                        "GetOperation",
                    ),
                ),
            )
            for name in names
        }
        self.sql_on = sql is not None
        """Whether statements can run here (``query.sql.enabled``)."""
        if sql is not None:
            self._methods["Execute"] = call(SQL_RPC + "Execute", sql.start)

    async def unary(
        self,
        name: str,
        message: Any,
        request: web.Request,
        grant: Grant | None,
        timeout_s: float | None = TIMEOUT_S,
    ) -> Any:
        """Call one unary method (``Get``, ``Pause``, ...) as the session's token."""
        return await self._methods[name](message, ConsoleContext(request, grant, timeout_s))

    async def sql(
        self, message: sql_pb.ExecuteRequest, request: web.Request, grant: Grant | None
    ) -> Answer:
        """A statement checked and started as the session's token: its answer, whose
        batches the page reads. No deadline of the page's own: ``query.sql.timeout``
        bounds a statement, as it does one from any other front."""
        if not self.sql_on:
            raise HttpAbort(
                grpc.StatusCode.UNIMPLEMENTED, "SQL is turned off here (query.sql.enabled)"
            )
        answer: Answer = await self.unary("Execute", message, request, grant, timeout_s=None)
        return answer

    def stream(
        self,
        name: str,
        message: Any,
        request: web.Request,
        grant: Grant | None,
        on_opened: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncGenerator[Any, None]:
        """Call one server-streaming method (``Query``, ``Watch``) as the session's token;
        ``on_opened`` runs once the stream is positioned."""
        timeout = None if name == "Watch" else TIMEOUT_S
        stream: AsyncGenerator[Any, None] = self._methods[name](
            message, ConsoleContext(request, grant, timeout, on_opened)
        )
        return stream

    async def status(self, request: web.Request, grant: Grant | None) -> list[Any]:
        """Every map the token may see with its status, in name order.

        A token granted some maps asks for those by name: a status of every map
        would be refused for the ones it may not see.
        """
        if grant is None or grant.maps is None:
            answer = await self.unary("GetStatus", admin_pb.GetStatusRequest(), request, grant)
            return list(answer.maps)
        listed = await self.unary("ListMaps", admin_pb.ListMapsRequest(), request, grant)
        statuses = []
        for info in listed.maps:
            if grant.allows_map(info.name):
                answer = await self.unary(
                    "GetStatus", admin_pb.GetStatusRequest(map=info.name), request, grant
                )
                statuses.extend(answer.maps)
        return statuses
