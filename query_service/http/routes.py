"""The HTTP/JSON front's handlers: each endpoint a servicer method, called as gRPC calls it.

A handler turns the HTTP request into the method's protobuf request, calls
the method through ``MethodCall`` (the same authorization, metrics and error
mapping as the gRPC server) with an ``HttpContext``, and writes the answer as
JSON. What exists is ``query_service.http.endpoints.ENDPOINTS``: ``HttpFront``
has one handler per endpoint, found by its name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import orjson
from aiohttp import web
from google.protobuf import json_format

from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import common_pb2 as common
from materializer.v1 import enrich_service_pb2 as enrich_pb
from materializer.v1 import map_service_pb2 as map_pb
from materializer.v1 import sql_service_pb2 as sql_pb
from query_service.auth import Authorizer
from query_service.health import RedisHealth
from query_service.http import shapes
from query_service.http.calls import HttpAbort, HttpContext, error_body, error_response
from query_service.http.endpoints import (
    ADMIN_RPC,
    AS_OF_VERSION,
    BATCH,
    JSON,
    LIMIT,
    MAPS_RPC,
    NDJSON,
    PAGE_SIZE,
    SQL_RPC,
    SSE,
    Endpoint,
)
from query_service.http.params import (
    body_offsets,
    bool_param,
    int_param,
    invalid,
    json_body,
    list_param,
    offsets_param,
    timeout_param,
)
from query_service.http.sql_answers import answer_format, sql_param, write_answer
from query_service.interceptors import MethodCall, RequestMaps
from query_service.services.admin_service import AdminServicer
from query_service.services.enrich_service import EnrichServicer
from query_service.services.map_service import MapServicer
from query_service.services.sql_service import SqlServicer

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
"""A comment line on an idle change stream: proxies keep it open, a gone client is noticed."""
ENRICH_BATCH = 500
"""Events per request of the enrichment an NDJSON body becomes, unless ``batch`` says."""
MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest NDJSON event line taken; the gRPC message limit."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON)


def _message(message: Any, status: int = 200) -> web.Response:
    """A gRPC answer in protobuf's JSON mapping, field names as in the .proto."""
    doc = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _json(doc, status)


def _section_json(section: dict[str, Any]) -> str:
    """A map's section for the gRPC call; a number JSON readers cannot take is a 400."""
    try:
        return orjson.dumps(section).decode()
    except TypeError as exc:  # an integer beyond 64 bits, which the body's parser keeps
        raise invalid(f"config: {exc}: numbers must fit in 64 bits") from None


def _definition(answer: admin_pb.MapDefinition) -> dict[str, Any]:
    """A ``MapDefinition`` with its section as a JSON object (``shapes.MapDefinition``)."""
    return {
        "name": answer.map,
        "config": orjson.Fragment(answer.config_json),
        "origin": answer.origin,
        "version": answer.version,
        "changed_by": answer.changed_by,
        "changed_at": answer.changed_at.ToJsonString() if answer.HasField("changed_at") else None,
        "created": answer.created,
        "rebuilding": answer.rebuilding,
    }


async def sse_changes(
    request: web.Request,
    watch: Callable[[Callable[[], Awaitable[None]]], AsyncGenerator[Any, None]],
) -> web.StreamResponse:
    """A ``Watch`` stream written as Server-Sent Events (the API's and the console's).

    ``watch`` starts the call given what to do once the stream is positioned: the
    response starts then, so a refusal before it is still an error status.
    """
    response = web.StreamResponse(headers={"Content-Type": SSE, "Cache-Control": "no-cache"})

    async def opened() -> None:
        await response.prepare(request)

    stream = watch(opened)
    answers = _with_keepalives(stream, response)
    try:
        async for answer in answers:
            if answer is None:
                await response.write(b": keepalive\n\n")
                continue
            await response.write(b"".join(_sse(change) for change in answer.changes))
    except HttpAbort as exc:
        if not response.prepared:
            raise
        # Positioned, then ended (the stream trimmed past this watcher): said in the stream.
        await response.write(
            b"event: error\ndata: " + error_body(exc.code.name, exc.message) + b"\n\n"
        )
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the client went away
    finally:
        # The keepalives' pending read of the stream goes first: a generator that is
        # being read cannot be closed (a client gone during a keepalive made that a 500).
        await answers.aclose()
        await stream.aclose()
    return response


def _entry(key: str, found: bool, raw: bytes) -> dict[str, Any]:
    return {"key": key, "found": found, "entity": shapes.entity_json(raw) if found else None}


class HttpFront:
    """The endpoints' handlers over the servicers the gRPC server also serves."""

    def __init__(
        self,
        maps: MapServicer,
        enrich: EnrichServicer,
        admin: AdminServicer,
        sql: SqlServicer,
        health: RedisHealth,
        authorizer: Authorizer | None,
        request_maps: RequestMaps,
        openapi: Callable[[], bytes],
    ) -> None:
        self._health = health
        self._openapi = openapi
        self._marks: dict[bytes, orjson.Fragment] = {}

        def call(method: str, behavior: Any, streaming: bool = False) -> Any:
            return MethodCall(method, authorizer, request_maps).wrap(
                behavior, streaming_requests=streaming
            )

        self._get = call(MAPS_RPC + "Get", maps.Get)
        self._get_as_of = call(MAPS_RPC + "GetAsOf", maps.GetAsOf)
        self._batch_get = call(MAPS_RPC + "BatchGet", maps.BatchGet)
        self._query = call(MAPS_RPC + "Query", maps.Query)
        self._watch = call(MAPS_RPC + "Watch", maps.Watch)
        self._enrich = call("/materializer.v1.EnrichService/Enrich", enrich.Enrich, True)
        self._list_maps = call(ADMIN_RPC + "ListMaps", admin.ListMaps)
        self._status = call(ADMIN_RPC + "GetStatus", admin.GetStatus)
        self._pause = call(ADMIN_RPC + "Pause", admin.Pause)
        self._resume = call(ADMIN_RPC + "Resume", admin.Resume)
        self._restart = call(ADMIN_RPC + "Restart", admin.Restart)
        self._validate = call(ADMIN_RPC + "ValidateConfig", admin.ValidateConfig)
        self._create_map = call(ADMIN_RPC + "CreateMap", admin.CreateMap)
        self._get_map_config = call(ADMIN_RPC + "GetMapConfig", admin.GetMapConfig)
        self._put_map_config = call(ADMIN_RPC + "PutMapConfig", admin.PutMapConfig)
        self._delete_map = call(ADMIN_RPC + "DeleteMap", admin.DeleteMap)
        self._start_operation = call(ADMIN_RPC + "StartOperation", admin.StartOperation)
        self._get_operation = call(ADMIN_RPC + "GetOperation", admin.GetOperation)
        self._sql = call(SQL_RPC + "Execute", sql.start)

    def handler(self, endpoint: Endpoint) -> Handler:
        """The handler of ``endpoint``."""
        handler: Handler = getattr(self, endpoint.name)
        return handler

    async def list_maps(self, request: web.Request) -> web.Response:
        """``ListMaps``."""
        answer = await self._list_maps(admin_pb.ListMapsRequest(), HttpContext(request))
        return _message(answer)

    async def get_entity(self, request: web.Request) -> web.Response:
        """``Get``, or ``GetAsOf`` with ``as_of_version`` / ``as_of_timestamp``."""
        name, key = request.match_info["map"], request.match_info["key"]
        version = int_param(request, AS_OF_VERSION)
        stamp = request.query.get("as_of_timestamp")
        context = HttpContext(request, timeout_param(request))
        wanted = common.Freshness(min_offsets=offsets_param(request.query.get("min_offsets")))
        if version is not None or stamp is not None:
            as_of = map_pb.GetAsOfRequest(map=name, key=key, freshness=wanted)
            if version is not None and stamp is not None:
                raise invalid("as_of_version and as_of_timestamp: give one")
            if version is not None:
                as_of.version = version
            else:
                try:
                    as_of.timestamp.FromJsonString(stamp or "")
                except ValueError:
                    raise invalid(f"as_of_timestamp: not RFC 3339: {stamp!r}") from None
            then = await self._get_as_of(as_of, context)
            body: dict[str, Any] = {
                **_entry(key, then.found, then.entity),
                "table_version": then.table_version,
            }
            if then.HasField("committed_at"):
                body["committed_at"] = then.committed_at.ToJsonString()
            body["watermark"] = self._watermark(then) if then.HasField("watermark") else None
            return _json(body)
        answer = await self._get(map_pb.GetRequest(map=name, key=key, freshness=wanted), context)
        body = _entry(key, answer.found, answer.entity)
        body["watermark"] = self._watermark(answer) if answer.HasField("watermark") else None
        return _json(body)

    def _watermark(self, answer: Any) -> orjson.Fragment:
        """``shapes.watermark`` of the answer's watermark as JSON, once per watermark: the
        lookups of a moment share one."""
        wire = answer.watermark.SerializeToString()
        kept = self._marks.get(wire)
        if kept is None:
            if len(self._marks) > 64:
                self._marks.clear()
            kept = self._marks[wire] = orjson.Fragment(
                orjson.dumps(shapes.watermark(answer.watermark))
            )
        return kept

    async def batch_get(self, request: web.Request) -> web.Response:
        """``BatchGet`` of a JSON body's keys."""
        asked = await json_body(request, shapes.BatchGetBody)
        call = map_pb.BatchGetRequest(
            map=request.match_info["map"],
            keys=asked.keys,
            freshness=common.Freshness(min_offsets=body_offsets(asked.min_offsets)),
        )
        timeout = None if asked.timeout_ms is None else asked.timeout_ms / 1000
        answer = await self._batch_get(call, HttpContext(request, timeout))
        body: dict[str, Any] = {
            "entries": [_entry(e.key, e.found, e.entity) for e in answer.entries],
            "watermark": self._watermark(answer) if answer.HasField("watermark") else None,
        }
        return _json(body)

    async def query(self, request: web.Request) -> web.Response:
        """The first page of ``Query``; its ``next_page_token`` asks for the next."""
        call = map_pb.QueryRequest(
            map=request.match_info["map"],
            fields=list_param(request, "fields"),
            limit=int_param(request, LIMIT) or 0,
            page_size=int_param(request, PAGE_SIZE) or 0,
            page_token=request.query.get("page_token", ""),
            freshness=common.Freshness(min_offsets=offsets_param(request.query.get("min_offsets"))),
        )
        if "where" in request.query:
            call.where = request.query["where"]
        pages = self._query(call, HttpContext(request, timeout_param(request)))
        try:
            page = await anext(pages, None)
        finally:
            await pages.aclose()
        rows = [] if page is None else page.rows
        body = {
            "rows": [{"key": r.key, "entity": shapes.entity_json(r.entity)} for r in rows],
            "next_page_token": (page.page_token or None) if page is not None else None,
            "table_version": page.table_version if page is not None else -1,
            "watermark": (
                self._watermark(page) if page is not None and page.HasField("watermark") else None
            ),
        }
        return _json(body)

    async def changes(self, request: web.Request) -> web.StreamResponse:
        """``Watch`` as Server-Sent Events: ``id`` the change id, ``data`` a ``ChangeEvent``."""
        after = request.headers.get("Last-Event-ID") or request.query.get("after", "")
        call = map_pb.WatchRequest(
            map=request.match_info["map"],
            after_change_id=after,
            include_entities=bool_param(request, "include_entities"),
            keys=list_param(request, "keys"),
        )
        return await sse_changes(
            request, lambda opened: self._watch(call, HttpContext(request, None, opened))
        )

    async def enrich(self, request: web.Request) -> web.StreamResponse:
        """``Enrich`` of an NDJSON body, answered line by line as the lookups go."""
        first = enrich_pb.EnrichRequest(
            freshness=common.Freshness(min_offsets=offsets_param(request.query.get("min_offsets")))
        )
        spec, profile = request.query.get("spec"), request.query.get("profile")
        if (spec is None) == (profile is None):
            # Checked before the body is read: an empty body is no reason to skip it.
            raise invalid(f"spec {'and' if spec is not None else 'or'} profile: give one")
        if profile is not None and not profile:
            raise invalid("profile: empty; name an enrichment profile of the configuration")
        if spec is not None:
            try:
                json_format.Parse(spec, first.spec)
            except json_format.ParseError as exc:
                raise invalid(f"spec: {exc}") from None
        else:
            first.profile = profile or ""
        batch = int_param(request, BATCH) or ENRICH_BATCH
        starts: list[int] = []

        async def requests() -> AsyncIterator[enrich_pb.EnrichRequest]:
            pending = first
            events: list[bytes] = []
            seen = 0
            while True:
                try:
                    line = await request.content.readline()
                except ValueError:
                    raise HttpAbort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"line {seen + len(events) + 1}: longer than {MAX_LINE_BYTES} bytes",
                    ) from None
                if line.strip():
                    events.append(line.strip())
                if events and (len(events) >= batch or not line):
                    pending.events.extend(events)
                    pending.request_id = str(len(starts))
                    starts.append(seen)
                    seen += len(events)
                    events = []
                    yield pending
                    pending = enrich_pb.EnrichRequest()
                if not line:
                    return

        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        # timeout_ms bounds each wait for min_offsets, as a gRPC deadline does: without one
        # a position the map never reaches held the stream for the gate's whole minute.
        answers = self._enrich(requests(), HttpContext(request, timeout_param(request)))
        try:
            async for answer in answers:
                if not response.prepared:
                    await response.prepare(request)
                start = starts[int(answer.request_id)]
                await response.write(b"".join(_enriched(start, e) for e in answer.events))
        except HttpAbort as exc:
            if not response.prepared:
                raise
            await response.write(error_body(exc.code.name, exc.message) + b"\n")
        finally:
            await answers.aclose()
        if not response.prepared:
            await response.prepare(request)  # an empty body: nothing to enrich
        await response.write_eof()
        return response

    async def sql(self, request: web.Request) -> web.StreamResponse:
        """``Execute``, answered as the Accept header asks (``sql_answers``)."""
        asked = await json_body(request, shapes.SqlBody)
        call = sql_pb.ExecuteRequest(
            sql=asked.sql,
            params=[sql_param(value, i) for i, value in enumerate(asked.params)],
            freshness=common.Freshness(min_offsets=body_offsets(asked.min_offsets)),
            limit=asked.limit,
        )
        timeout = None if asked.timeout_ms is None else asked.timeout_ms / 1000
        kind = answer_format(request.headers.get("Accept"))
        answer = await self._sql(call, HttpContext(request, timeout))
        return await write_answer(request, answer, kind)

    async def status(self, request: web.Request) -> web.Response:
        """``GetStatus`` of one map."""
        call = admin_pb.GetStatusRequest(map=request.match_info["map"])
        answer = await self._status(call, HttpContext(request))
        return _message(answer.maps[0])

    async def pause(self, request: web.Request) -> web.Response:
        """``Pause``: accepted; the map pauses after its batch in flight."""
        call = admin_pb.ControlRequest(map=request.match_info["map"])
        return _message(await self._pause(call, HttpContext(request)), 202)

    async def resume(self, request: web.Request) -> web.Response:
        """``Resume``."""
        call = admin_pb.ControlRequest(map=request.match_info["map"])
        return _message(await self._resume(call, HttpContext(request)), 202)

    async def restart(self, request: web.Request) -> web.Response:
        """``Restart``."""
        call = admin_pb.ControlRequest(map=request.match_info["map"])
        return _message(await self._restart(call, HttpContext(request)), 202)

    async def create_map(self, request: web.Request) -> web.Response:
        """``CreateMap`` of a ``{"name", "config"}`` body."""
        asked = await json_body(request, shapes.CreateMapBody)
        call = admin_pb.PutMapRequest(map=asked.name, config_json=_section_json(asked.config))
        answer = await self._create_map(call, HttpContext(request))
        return _json(_definition(answer), 201)

    async def get_map_config(self, request: web.Request) -> web.Response:
        """``GetMapConfig``: the section itself, as Kafka Connect answers a connector's."""
        call = admin_pb.GetMapConfigRequest(map=request.match_info["map"])
        answer = await self._get_map_config(call, HttpContext(request))
        return web.Response(body=answer.config_json, content_type=JSON)

    async def put_map_config(self, request: web.Request) -> web.Response:
        """``PutMapConfig`` of a body that is the map's section."""
        raw = await request.read()
        try:
            section = orjson.loads(raw or b"null")
        except orjson.JSONDecodeError as exc:
            raise invalid(f"body: not JSON: {exc}") from None
        if not isinstance(section, dict):
            raise invalid("body: must be a JSON object, the map's section of the configuration")
        call = admin_pb.PutMapRequest(
            map=request.match_info["map"],
            config_json=_section_json(section),
            rebuild=bool_param(request, "rebuild"),
        )
        answer = await self._put_map_config(call, HttpContext(request))
        return _json(_definition(answer))

    async def delete_map(self, request: web.Request) -> web.Response:
        """``DeleteMap``, with ``purge``."""
        call = admin_pb.DeleteMapRequest(
            map=request.match_info["map"], purge=bool_param(request, "purge")
        )
        answer = await self._delete_map(call, HttpContext(request))
        return _json({"name": answer.map, "version": answer.version, "purged": list(answer.purged)})

    async def start_operation(self, request: web.Request) -> web.Response:
        """``StartOperation`` of a ``{"kind"}`` body: accepted, the run carries it out. A
        refusal for the map's state (one under way, no run) is a 409, as Kafka Connect
        answers a restart it cannot take now."""
        asked = await json_body(request, shapes.OperationBody)
        call = admin_pb.OperationRequest(map=request.match_info["map"], kind=asked.kind)
        try:
            answer = await self._start_operation(call, HttpContext(request))
        except HttpAbort as exc:
            if exc.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            return web.Response(
                body=error_body(exc.code.name, exc.message), status=409, content_type=JSON
            )
        return _message(answer, 202)

    async def last_operation(self, request: web.Request) -> web.Response:
        """``GetOperation``."""
        call = admin_pb.GetOperationRequest(map=request.match_info["map"])
        return _message(await self._get_operation(call, HttpContext(request)))

    async def validate(self, request: web.Request) -> web.Response:
        """``ValidateConfig`` of the body, a configuration document."""
        text = await request.text()
        answer = await self._validate(
            admin_pb.ValidateConfigRequest(config=text), HttpContext(request)
        )
        return _message(answer)

    async def healthz(self, _: web.Request) -> web.Response:
        """Liveness: the process answers."""
        return _json({"status": "SERVING"})

    async def readyz(self, request: web.Request) -> web.Response:
        """Readiness: Redis answers, and with ``map`` that map is neither being restored nor
        catching up (the answer says which)."""
        name = request.query.get("map")
        ok = self._health.serving if name is None else self._health.map_serving(name)
        if ok:
            return _json({"status": "SERVING"})
        if not self._health.serving:
            why = "not serving: Redis does not answer"
        else:
            why = (name and self._health.map_reason(name)) or f"map {name!r} is not serving"
        return error_response(grpc.StatusCode.UNAVAILABLE, why)

    async def openapi(self, _: web.Request) -> web.Response:
        """The OpenAPI document of ``ENDPOINTS``."""
        return web.Response(body=self._openapi(), content_type=JSON)


async def _with_keepalives(
    stream: AsyncIterator[Any], response: web.StreamResponse
) -> AsyncGenerator[Any, None]:
    """The stream's items, and None after each ``KEEPALIVE_S`` without one (once it is open)."""
    waiting: asyncio.Task[Any] | None = None
    try:
        while True:
            if waiting is None:
                waiting = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({waiting}, timeout=KEEPALIVE_S)
            if not done:
                if response.prepared:
                    yield None
                continue
            task, waiting = waiting, None
            try:
                yield task.result()
            except StopAsyncIteration:
                return
    finally:
        if waiting is not None:
            waiting.cancel()
            with contextlib.suppress(BaseException):
                await waiting


_OPS = {
    map_pb.Change.UPSERT: "upsert",
    map_pb.Change.DELETE: "delete",
    map_pb.Change.EXPIRE: "expire",
}


def _sse(change: map_pb.Change) -> bytes:
    data: dict[str, Any] = {
        "change_id": change.change_id,
        "key": change.key,
        "op": _OPS.get(change.op, "upsert"),
        "batch_id": change.batch_id,
    }
    if change.entity:
        data["entity"] = shapes.entity_json(change.entity)
    return b"id: %s\nevent: change\ndata: %s\n\n" % (change.change_id.encode(), orjson.dumps(data))


def _enriched(start: int, event: enrich_pb.EnrichedEvent) -> bytes:
    line: dict[str, Any] = {"index": start + event.index}
    enriched = event.event and not event.dropped and not event.error
    line["event"] = shapes.entity_json(event.event) if enriched else None
    if event.dropped:
        line["dropped"] = True
    if event.error:
        line["error"] = event.error
    if event.missed:
        line["missed"] = list(event.missed)
    return orjson.dumps(line) + b"\n"
