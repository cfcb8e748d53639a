"""What every page of the console stands on: its template, its map check, its calls.

Every handler reads through ``ConsoleCalls`` as the session's token, so a page
shows only what the token may see and an action the token may not take is
refused by the same check as on gRPC. Pages are rendered whole on the server;
the parts that change (the overview's table, a map's summary) are fragments
htmx fetches again every few seconds, and the charts are drawn by uPlot from
``history.json``. Each page (``overview``, ``map_page``, ``map_form``,
``entities``, ``changes``, ``sql_page``) is a ``Page`` of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from aiohttp import web
from jinja2 import Environment

from materializer.catalog.live import LiveMaps
from materializer.v1 import admin_service_pb2 as admin_pb
from query_service.console import figures
from query_service.console.calls import ConsoleCalls
from query_service.console.history import HistoryReader
from query_service.console.sessions import SESSION, Session
from query_service.http.calls import HttpAbort

Call = Callable[[str, Any], Awaitable[Any]]
"""A unary servicer method by name, called as the request's session."""


class Page:
    """A page's handlers, over the calls of the logged-in token, the maps in force, the
    templates, and the run's own records (history samples, reports, operations)."""

    def __init__(
        self,
        calls: ConsoleCalls,
        live: LiveMaps,
        templates: Environment,
        base: str,
        history: HistoryReader,
    ) -> None:
        self._calls = calls
        self._live = live
        self._templates = templates
        self._base = base
        self._history = history

    def render(
        self, request: web.Request, template: str, http_status: int = 200, **values: Any
    ) -> web.Response:
        """A template with what every page needs: the base path, the session, the request."""
        session: Session = request[SESSION]
        text = self._templates.get_template(template).render(
            base=self._base, session=session, figures=figures, path=request.path, **values
        )
        return web.Response(text=text, status=http_status, content_type="text/html")

    def _known(self, request: web.Request) -> str:
        """The request's map, when it exists and the token may use it (404 and 403 as the
        servicers answer them): pages that call nothing before the form is used check
        here."""
        name = request.match_info["map"]
        session: Session = request[SESSION]
        if name not in self._live.config.maps:
            raise HttpAbort(grpc.StatusCode.NOT_FOUND, f"unknown map {name!r}")
        if session.grant is not None and not session.grant.allows_map(name):
            problem = f"token {session.grant.name!r} may not use map {name!r}"
            raise HttpAbort(grpc.StatusCode.PERMISSION_DENIED, problem)
        return name

    def _call(self, request: web.Request) -> Call:
        """The request's unary calls, as its session's token."""
        session: Session = request[SESSION]

        async def call(name: str, message: Any) -> Any:
            return await self._calls.unary(name, message, request, session.grant)

        return call


def state_name(status: admin_pb.MapStatus) -> str:
    """A map's state as the pages write it (``running``, ``paused``...)."""
    return str(admin_pb.MapStatus.State.Name(status.state)).lower()


def records_left(status: admin_pb.MapStatus) -> int:
    """Records the map has yet to fold: its partitions' lag (a negative lag counts none)."""
    return sum(max(0, p.lag) for p in status.partitions)


def invalid(problem: str) -> HttpAbort:
    """A refusal of what the form or the address asked, as the API refuses it (400)."""
    return HttpAbort(grpc.StatusCode.INVALID_ARGUMENT, problem)
