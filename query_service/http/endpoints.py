"""The HTTP/JSON front's endpoint table: what exists, and what each one calls.

``ENDPOINTS`` is the one table of what exists: the router serves it, the
OpenAPI document is built from it and the tests walk it. It lives apart from
the handlers so that the document (and the reference rendered from it) is
built from the table alone, without the servicers the handlers call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pydantic
from google.protobuf.message import Message

from materializer.v1 import admin_service_pb2 as admin_pb
from query_service.http import shapes
from query_service.tables.query_plan import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE

JSON = "application/json"
NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


@dataclass(frozen=True)
class Param:
    """A path, query or header parameter, for the OpenAPI document."""

    name: str
    where: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True)
class Endpoint:
    """One route: what it answers, from which servicer method, described for OpenAPI."""

    method: str
    path: str
    name: str
    """The handler's name in ``HttpFront``, and the OpenAPI operation id."""
    summary: str
    rpc: str | None = None
    """The gRPC method it calls (its verb for bearer-token grants)."""
    params: tuple[Param, ...] = ()
    body: type[pydantic.BaseModel] | str | None = None
    """A model of the JSON body, or the media type of a body taken as is."""
    answer: type[pydantic.BaseModel] | type[Message] | str = shapes.Health
    """A model, a protobuf message (admin answers) or a streamed media type."""
    status: int = 200


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
"""The largest values of the protobuf fields the numbers travel in: a larger one is a 400
naming its parameter, never an overflow deep in the call."""

OFFSETS_ITEM = r"[A-Za-z0-9._-]+:[0-9]{1,9}:[0-9]{1,18}"
"""One ``topic:partition:offset`` of ``min_offsets``: a Kafka topic name, and numbers that
fit the partition's int32 and the offset's int64."""

MAP = Param("map", "path", "the map's name", required=True)
KEY = Param("key", "path", "the entity's key", required=True)
TIMEOUT = Param(
    "timeout_ms",
    "query",
    "how long to wait for min_offsets (or a query) before 504",
    {"type": "integer", "minimum": 1, "maximum": INT32_MAX},
)
MIN_OFFSETS = Param(
    "min_offsets",
    "query",
    "read-your-writes: topic:partition:offset,... the answer must reflect",
    {"type": "string", "pattern": f"^({OFFSETS_ITEM})?(,({OFFSETS_ITEM})?)*$"},
)
AS_OF_VERSION = Param(
    "as_of_version",
    "query",
    "a Delta table version (not with as_of_timestamp)",
    {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
)
LIMIT = Param(
    "limit",
    "query",
    "rows in all pages at most",
    {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
)
PAGE_SIZE = Param(
    "page_size",
    "query",
    f"rows in this page at most (0: {DEFAULT_PAGE_SIZE})",
    {"type": "integer", "minimum": 0, "maximum": MAX_PAGE_SIZE},
)
BATCH = Param(
    "batch",
    "query",
    "events per lookup round",
    {"type": "integer", "minimum": 1, "maximum": INT32_MAX},
)

# The prefixes of gRPC method names: an endpoint's ``rpc`` and its handler's ``MethodCall``
# must name the same method, as bearer-token grants and metrics go by that name.
MAPS_RPC = "/materializer.v1.MapService/"
ADMIN_RPC = "/materializer.v1.AdminService/"

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/v1/maps", "list_maps", "The declared maps", ADMIN_RPC + "ListMaps",
             answer=admin_pb.ListMapsResponse),
    Endpoint(
        "GET", "/v1/maps/{map}/entities/{key}", "get_entity",
        "One entity and the map's watermark, or as the Delta table held it (as_of_*)",
        MAPS_RPC + "Get",
        (MAP, KEY, MIN_OFFSETS, TIMEOUT,
         AS_OF_VERSION,
         Param("as_of_timestamp", "query",
               "RFC 3339: the version current then (not with as_of_version)")),
        answer=shapes.EntityLookup,
    ),
    Endpoint("POST", "/v1/maps/{map}/entities:batchGet", "batch_get",
             "Entities of many keys in one call", MAPS_RPC + "BatchGet", (MAP,),
             shapes.BatchGetBody, shapes.BatchGetAnswer),
    Endpoint(
        "GET", "/v1/maps/{map}/query", "query", "A page of the map's rows matching a filter",
        MAPS_RPC + "Query",
        (MAP, Param("where", "query", "a SQL filter on the entity's fields, as gRPC Query"),
         Param("fields", "query", "fields to return, comma-separated; all by default"),
         LIMIT,
         PAGE_SIZE,
         Param("page_token", "query", "next_page_token of the page before")),
        answer=shapes.QueryPage,
    ),
    Endpoint(
        "GET", "/v1/maps/{map}/changes", "changes",
        "The map's changes as Server-Sent Events, from now or after a change id",
        MAPS_RPC + "Watch",
        (MAP, Param("after", "query", "a change id; 0 for every retained change"),
         Param("include_entities", "query", "send upserted entities", {"type": "boolean"}),
         Param("keys", "query", "only these keys, comma-separated"),
         Param("Last-Event-ID", "header", "resume after this change (over 'after')")),
        answer=SSE,
    ),
    Endpoint(
        "POST", "/v1/enrich", "enrich",
        "Newline-delimited JSON events in, enriched events out (one line each), streamed",
        "/materializer.v1.EnrichService/Enrich",
        (Param("profile", "query", "an enrichment profile of the configuration"),
         Param("spec", "query", "a JoinSpec in protobuf JSON, instead of a profile"),
         MIN_OFFSETS,
         BATCH),
        NDJSON, NDJSON,
    ),
    Endpoint("GET", "/v1/maps/{map}/status", "status", "The map's state, lag and rates",
             ADMIN_RPC + "GetStatus", (MAP,), answer=admin_pb.MapStatus),
    Endpoint("PUT", "/v1/maps/{map}/pause", "pause", "Stop folding after the batch in flight",
             ADMIN_RPC + "Pause", (MAP,), answer=admin_pb.ControlResponse, status=202),
    Endpoint("PUT", "/v1/maps/{map}/resume", "resume", "Fold again from where it paused",
             ADMIN_RPC + "Resume", (MAP,), answer=admin_pb.ControlResponse, status=202),
    Endpoint("POST", "/v1/maps/{map}/restart", "restart", "Stop and start the map's queries",
             ADMIN_RPC + "Restart", (MAP,), answer=admin_pb.ControlResponse, status=202),
    Endpoint("PUT", "/v1/config/validate", "validate", "Check a configuration (YAML or JSON)",
             ADMIN_RPC + "ValidateConfig", (), "application/yaml",
             admin_pb.ValidateConfigResponse),
    Endpoint("GET", "/healthz", "healthz", "The process is up"),
    Endpoint("GET", "/readyz", "readyz",
             "Redis answers (and the map, with ?map=, is not being restored): 200, else 503",
             params=(Param("map", "query", "one map's readiness"),)),
    Endpoint("GET", "/openapi.json", "openapi", "This document", answer=JSON),
)  # fmt: skip
