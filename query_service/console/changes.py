"""A map's changes as they happen: ``Watch`` as Server-Sent Events, filtered by key.

The page holds only the stream's address; the stream is the HTTP/JSON front's own
(``sse_changes``), opened as the session's token instead of a bearer header.
"""

from __future__ import annotations

from aiohttp import web

from materializer.v1 import map_service_pb2 as map_pb
from query_service.console.page import Page
from query_service.console.sessions import SESSION, Session
from query_service.http.changes import sse_changes


class Changes(Page):
    """The live changes page and its event stream."""

    async def changes(self, request: web.Request) -> web.Response:
        """The page that shows the map's changes as they happen."""
        name = self._known(request)
        return self.render(request, "changes.html", name=name, key=request.query.get("key", ""))

    async def changes_stream(self, request: web.Request) -> web.StreamResponse:
        """``Watch`` as Server-Sent Events, as the session's token, filtered by key."""
        session: Session = request[SESSION]
        keys = [k.strip() for k in request.query.get("key", "").split(",") if k.strip()]
        call = map_pb.WatchRequest(map=request.match_info["map"], include_entities=True, keys=keys)
        return await sse_changes(
            request,
            lambda opened: self._calls.stream(
                "Watch", call, request, session.grant, on_opened=opened
            ),
        )
