"""The entity browser: Get, BatchGet, a filtered Query with paging, an as-of read.

Each answer is shown as indented JSON (escaped: it is user data) with the watermark or
table version it was read at, beside the HTTP and grpcurl commands that ask the same,
so what an operator found by hand can be asked again from a script.
"""

from __future__ import annotations

import shlex
from typing import Any
from urllib.parse import quote, urlencode

import orjson
from aiohttp import web

from materializer.v1 import map_service_pb2 as map_pb
from query_service.console.page import Page, invalid
from query_service.console.sessions import SESSION, Session
from query_service.http import shapes
from query_service.http.calls import HttpAbort

QUERY_PAGE = 50
"""Rows per page of the entity browser's query, unless ``page_size`` says."""
QUERY_PAGE_MAX = 500
"""The largest ``page_size`` the entity browser asks for."""


def _pretty(raw: bytes) -> str:
    """An entity's JSON, indented for reading (rendered escaped: it is user data)."""
    try:
        return orjson.dumps(orjson.loads(raw), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


def _watermark(message: Any) -> dict[str, Any] | None:
    return shapes.watermark(message.watermark) if message.HasField("watermark") else None


def _keys(text: str) -> list[str]:
    """The keys typed for a BatchGet: separated by commas or lines, blanks left out."""
    return [k.strip() for k in text.replace("\n", ",").split(",") if k.strip()]


class EntityBrowser(Page):
    """A map's entities, read as the session's token."""

    async def entities(self, request: web.Request) -> web.Response:
        """Get, BatchGet, a filtered Query with paging, an as-of read; the same by hand."""
        name = self._known(request)
        q = request.query
        op = q.get("op", "")
        call = self._call(request)
        result: dict[str, Any] | None = None
        error: str | None = None
        try:
            if op == "get" and q.get("key"):
                answer = await call("Get", map_pb.GetRequest(map=name, key=q["key"]))
                result = {
                    "rows": [(q["key"], answer.found, _pretty(answer.entity))],
                    "watermark": _watermark(answer),
                }
            elif op == "batch" and q.get("keys"):
                keys = _keys(q["keys"])
                answer = await call("BatchGet", map_pb.BatchGetRequest(map=name, keys=keys))
                result = {
                    "rows": [(e.key, e.found, _pretty(e.entity)) for e in answer.entries],
                    "watermark": _watermark(answer),
                }
            elif op == "query":
                result = await self._query(request, name)
            elif op == "asof" and q.get("key"):
                result = await self._as_of(request, name)
        except HttpAbort as exc:
            error = f"{exc.code.name}: {exc.message}"
        return self.render(
            request,
            "entities.html",
            name=name,
            op=op,
            q=q,
            result=result,
            error=error,
            commands=self._commands(request, name) if op and error is None else None,
        )

    async def _query(self, request: web.Request, name: str) -> dict[str, Any]:
        q = request.query
        try:
            size = min(QUERY_PAGE_MAX, max(1, int(q.get("page_size") or QUERY_PAGE)))
        except ValueError:
            size = QUERY_PAGE
        message = map_pb.QueryRequest(map=name, page_size=size, page_token=q.get("page_token", ""))
        if q.get("where"):
            message.where = q["where"]
        session: Session = request[SESSION]
        pages = self._calls.stream("Query", message, request, session.grant)
        try:
            page = await anext(pages, None)
        finally:
            await pages.aclose()
        rows = [] if page is None else [(r.key, True, _pretty(r.entity)) for r in page.rows]
        return {
            "rows": rows,
            "table_version": page.table_version if page is not None else None,
            "next_page_token": page.page_token if page is not None else "",
        }

    async def _as_of(self, request: web.Request, name: str) -> dict[str, Any]:
        q = request.query
        message = map_pb.GetAsOfRequest(map=name, key=q["key"])
        when = q.get("as_of", "").strip()
        if when.isdigit():
            message.version = int(when)
        elif when:
            try:
                message.timestamp.FromJsonString(when)
            except ValueError:
                raise invalid(f"as_of: a version or an RFC 3339 time, not {when!r}") from None
        answer = await self._call(request)("GetAsOf", message)
        return {
            "rows": [(q["key"], answer.found, _pretty(answer.entity))],
            "table_version": answer.table_version,
            "committed_at": answer.committed_at.ToJsonString()
            if answer.HasField("committed_at")
            else None,
        }

    def _commands(self, request: web.Request, name: str) -> dict[str, str]:
        """The HTTP and grpcurl commands that ask the same; the token stays ``$TOKEN``."""
        q = request.query
        origin = f"{request.scheme}://{request.host}"
        grpc_host = f"{request.host.rsplit(':', 1)[0]}:{self._live.config.query.port}"
        auth = ' -H "Authorization: Bearer $TOKEN"' if request[SESSION].grant else ""
        gauth = ' -H "authorization: Bearer $TOKEN"' if request[SESSION].grant else ""
        plain = "" if self._live.config.query.tls else " -plaintext"
        op = q.get("op")
        path = f"/v1/maps/{quote(name, safe='')}"
        body: dict[str, Any]
        if op == "get":
            url = f"{origin}{path}/entities/{quote(q.get('key', ''), safe='')}"
            method, body = "Get", {"map": name, "key": q.get("key", "")}
            curl = f"curl{auth} {shlex.quote(url)}"
        elif op == "batch":
            keys = _keys(q.get("keys", ""))
            url = f"{origin}{path}/entities:batchGet"
            method, body = "BatchGet", {"map": name, "keys": keys}
            curl = (
                f"curl{auth} -H 'Content-Type: application/json' -d "
                f"{shlex.quote(orjson.dumps({'keys': keys}).decode())} {shlex.quote(url)}"
            )
        elif op == "query":
            params = {"where": q["where"]} if q.get("where") else {}
            url = f"{origin}{path}/query" + (f"?{urlencode(params)}" if params else "")
            method, body = "Query", {"map": name, **params}
            curl = f"curl{auth} {shlex.quote(url)}"
        else:
            when = q.get("as_of", "")
            key = "as_of_version" if when.isdigit() else "as_of_timestamp"
            url = f"{origin}{path}/entities/{quote(q.get('key', ''), safe='')}?" + urlencode(
                {key: when}
            )
            method = "GetAsOf"
            body = {"map": name, "key": q.get("key", "")}
            body["version" if when.isdigit() else "timestamp"] = (
                int(when) if when.isdigit() else when
            )
            curl = f"curl{auth} {shlex.quote(url)}"
        grpcurl = (
            f"grpcurl{plain}{gauth} -d {shlex.quote(orjson.dumps(body).decode())} "
            f"{grpc_host} materializer.v1.MapService/{method}"
        )
        return {"curl": curl, "grpcurl": grpcurl}
