"""The HTTP/JSON front's handlers: each endpoint a servicer method, called as gRPC calls it.

A handler turns the HTTP request into the method's protobuf request, calls
the method through ``MethodCall`` (the same authorization, metrics and error
mapping as the gRPC server) with an ``HttpContext``, and writes the answer as
JSON (``json_answers``), or streams it (``changes``, ``enrichment``, ``sql_answers``).
What exists is ``query_service.http.endpoints.ENDPOINTS``: ``HttpFront`` has one
handler per endpoint, found by its name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import orjson
from aiohttp import web
from google.protobuf import json_format

from materializer.config import MAP_NAME
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import common_pb2 as common
from materializer.v1 import enrich_service_pb2 as enrich_pb
from materializer.v1 import map_service_pb2 as map_pb
from materializer.v1 import sql_service_pb2 as sql_pb
from query_service.auth import Authorizer
from query_service.health import RedisHealth
from query_service.http import shapes
from query_service.http.calls import HttpAbort, HttpContext, error_body, error_response
from query_service.http.changes import sse_changes
from query_service.http.endpoints import (
    ADMIN_RPC,
    AS_OF_VERSION,
    BATCH,
    JSON,
    LIMIT,
    MAPS_RPC,
    PAGE_SIZE,
    SQL_RPC,
    Endpoint,
)
from query_service.http.enrichment import ENRICH_BATCH, enrich_ndjson
from query_service.http.json_answers import (
    Watermarks,
    definition,
    entry,
    json_response,
    message_response,
    section_json,
)
from query_service.http.params import (
    body_offsets,
    bool_param,
    change_id_param,
    config_body,
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

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
        self._watermarks = Watermarks()

        def call(method: str, behavior: Any, streaming: bool = False) -> Any:
            return MethodCall(method, authorizer, request_maps).wrap(
                behavior, streaming_requests=streaming
            )

        self._get = call(MAPS_RPC + "Get", maps.Get)
        self._get_as_of = call(MAPS_RPC + "GetAsOf", maps.GetAsOf)
        self._batch_get = call(MAPS_RPC + "BatchGet", maps.BatchGet)
        self._query = call(MAPS_RPC + "Query", maps.Query)
        self._watch = call(MAPS_RPC + "Watch", maps.Watch)
        self._get_schema = call(MAPS_RPC + "GetSchema", maps.GetSchema)
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
        return message_response(answer)

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
                **entry(key, then.found, then.entity),
                "table_version": then.table_version,
            }
            if then.HasField("committed_at"):
                body["committed_at"] = then.committed_at.ToJsonString()
            body["watermark"] = self._watermarks.of(then)
            return json_response(body)
        answer = await self._get(map_pb.GetRequest(map=name, key=key, freshness=wanted), context)
        body = entry(key, answer.found, answer.entity)
        body["watermark"] = self._watermarks.of(answer)
        if answer.from_table:
            body["table_version"] = answer.table_version
        return json_response(body)

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
            "entries": [entry(e.key, e.found, e.entity) for e in answer.entries],
            "watermark": self._watermarks.of(answer),
        }
        if answer.from_table:
            body["table_version"] = answer.table_version
        return json_response(body)

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
            "watermark": self._watermarks.of(page),
            "source": map_pb.QueryResponse.Source.Name(page.source) if page is not None else None,
            "index": (page.index or None) if page is not None else None,
        }
        return json_response(body)

    async def changes(self, request: web.Request) -> web.StreamResponse:
        """``Watch`` as Server-Sent Events: ``id`` the change id, ``data`` a ``ChangeEvent``."""
        call = map_pb.WatchRequest(
            map=request.match_info["map"],
            after_change_id=change_id_param(request),
            include_entities=bool_param(request, "include_entities"),
            keys=list_param(request, "keys"),
            include_left=bool_param(request, "include_left"),
        )
        if "where" in request.query:
            call.where = request.query["where"]
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
        # timeout_ms bounds each wait for min_offsets, as a gRPC deadline does: without one
        # a position the map never reaches held the stream for the gate's whole minute.
        context = HttpContext(request, timeout_param(request))
        return await enrich_ndjson(
            request, first, batch, lambda requests: self._enrich(requests, context)
        )

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

    async def get_schema(self, request: web.Request) -> web.Response:
        """``GetSchema``."""
        call = map_pb.GetSchemaRequest(map=request.match_info["map"])
        return message_response(await self._get_schema(call, HttpContext(request)))

    async def status(self, request: web.Request) -> web.Response:
        """``GetStatus`` of one map."""
        call = admin_pb.GetStatusRequest(map=request.match_info["map"])
        answer = await self._status(call, HttpContext(request))
        return message_response(answer.maps[0])

    async def pause(self, request: web.Request) -> web.Response:
        """``Pause``: accepted; the map pauses after its batch in flight."""
        call = admin_pb.ControlRequest(map=request.match_info["map"])
        return message_response(await self._pause(call, HttpContext(request)), 202)

    async def resume(self, request: web.Request) -> web.Response:
        """``Resume``."""
        call = admin_pb.ControlRequest(map=request.match_info["map"])
        return message_response(await self._resume(call, HttpContext(request)), 202)

    async def restart(self, request: web.Request) -> web.Response:
        """``Restart``."""
        call = admin_pb.ControlRequest(map=request.match_info["map"])
        return message_response(await self._restart(call, HttpContext(request)), 202)

    async def create_map(self, request: web.Request) -> web.Response:
        """``CreateMap`` of a ``{"name", "config"}`` body."""
        asked = await json_body(request, shapes.CreateMapBody)
        call = admin_pb.PutMapRequest(map=asked.name, config_json=section_json(asked.config))
        answer = await self._create_map(call, HttpContext(request))
        return json_response(definition(answer), 201)

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
            config_json=section_json(section),
            rebuild=bool_param(request, "rebuild"),
        )
        answer = await self._put_map_config(call, HttpContext(request))
        return json_response(definition(answer))

    async def delete_map(self, request: web.Request) -> web.Response:
        """``DeleteMap``, with ``purge``."""
        call = admin_pb.DeleteMapRequest(
            map=request.match_info["map"], purge=bool_param(request, "purge")
        )
        answer = await self._delete_map(call, HttpContext(request))
        return json_response(
            {"name": answer.map, "version": answer.version, "purged": list(answer.purged)}
        )

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
        return message_response(answer, 202)

    async def last_operation(self, request: web.Request) -> web.Response:
        """``GetOperation``."""
        call = admin_pb.GetOperationRequest(map=request.match_info["map"])
        return message_response(await self._get_operation(call, HttpContext(request)))

    async def validate(self, request: web.Request) -> web.Response:
        """``ValidateConfig`` of the body, a configuration document."""
        text = await config_body(request)
        answer = await self._validate(
            admin_pb.ValidateConfigRequest(config=text), HttpContext(request)
        )
        return message_response(answer)

    async def healthz(self, _: web.Request) -> web.Response:
        """Liveness: the process answers."""
        return json_response({"status": "SERVING"})

    async def readyz(self, request: web.Request) -> web.Response:
        """Readiness: Redis answers, and with ``map`` that map is neither being restored nor
        catching up (the answer says which)."""
        name = request.query.get("map")
        if name is not None and not MAP_NAME.fullmatch(name):
            return error_response(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"map: {name!r} is not a map's name (it must match {MAP_NAME.pattern})",
            )
        ok = self._health.serving if name is None else self._health.map_serving(name)
        if ok:
            return json_response({"status": "SERVING"})
        if not self._health.serving:
            why = "not serving: Redis does not answer"
        else:
            why = (name and self._health.map_reason(name)) or f"map {name!r} is not serving"
        return error_response(grpc.StatusCode.UNAVAILABLE, why)

    async def openapi(self, _: web.Request) -> web.Response:
        """The OpenAPI document of ``ENDPOINTS``."""
        return web.Response(body=self._openapi(), content_type=JSON)
