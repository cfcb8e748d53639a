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

from materializer.config import MAP_NAME
from materializer.v1 import admin_service_pb2 as admin_pb
from materializer.v1 import map_service_pb2 as map_pb
from query_service.http import shapes
from query_service.tables.query_plan import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE

JSON = "application/json"
NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
YAML = "application/yaml"


@dataclass(frozen=True)
class Param:
    """A path, query or header parameter, for the OpenAPI document."""

    name: str
    where: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False


Answer = type[pydantic.BaseModel] | type[Message] | str
"""What an endpoint answers: a model of its JSON, a protobuf message or a media type."""


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
    answer: Answer | tuple[Answer, ...] = shapes.Health
    """A model, a protobuf message (admin answers) or a streamed media type; several when
    the Accept header picks one."""
    status: int = 200


INT32_MAX = shapes.INT32_MAX
INT64_MAX = shapes.INT64_MAX

OFFSETS_ITEM = f"{shapes.TOPIC}:{shapes.PARTITION}:{shapes.OFFSET}"
"""One ``topic:partition:offset`` of ``min_offsets``: a Kafka topic name, and numbers that
fit the partition's int32 and the offset's int64."""

MAP = Param(
    "map", "path", "the map's name", {"type": "string", "pattern": MAP_NAME.pattern}, required=True
)
KEY = Param("key", "path", "the entity's key", shapes.KEY_SCHEMA, required=True)
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
TABLE_MIN_OFFSETS = Param(
    "min_offsets",
    "query",
    "read-your-writes on the Delta table: topic:partition:offset,... its version read must "
    "reflect (ignored with page_token)",
    MIN_OFFSETS.schema,
)
AS_OF_VERSION = Param(
    "as_of_version",
    "query",
    "a Delta table version",
    {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
)
AS_OF_TIMESTAMP = Param(
    "as_of_timestamp",
    "query",
    "RFC 3339: the version current then",
    {"type": "string", "format": "date-time"},
)
AS_OF = Param(
    "as_of",
    "query",
    "as_of_version=N or as_of_timestamp=RFC 3339, each a query parameter of its own, not both "
    "(400 naming both): the entity as that version of the Delta table held it",
    # A form-exploded object is how OpenAPI 3 says two query parameters exclude each other.
    {
        "type": "object",
        "properties": {
            p.name: {**p.schema, "description": p.description}
            for p in (AS_OF_VERSION, AS_OF_TIMESTAMP)
        },
        "additionalProperties": False,
        "maxProperties": 1,
    },
)
CHANGE_ID = {"type": "string", "pattern": "^([0-9]{1,20}(-[0-9]{1,20})?)?$"}
"""A change id as Redis writes it, ``ms-seq`` (each part at most 2^64 - 1), or ``ms``."""
JOIN = Param(
    "join",
    "query",
    "profile=NAME (an enrichment profile of the configuration) or spec=JSON (a JoinSpec in "
    "protobuf JSON), each a query parameter of its own: one of them, not both",
    {
        "type": "object",
        "properties": {
            "profile": {"type": "string", "minLength": 1},
            "spec": {"type": "string", "contentMediaType": JSON},
        },
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
    },
    required=True,
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
SQL_RPC = "/materializer.v1.SqlService/"

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/v1/maps", "list_maps", "The maps: the file's and those managed here",
             ADMIN_RPC + "ListMaps", answer=admin_pb.ListMapsResponse),
    Endpoint("POST", "/v1/maps", "create_map",
             "Create a map (Kafka Connect's POST /connectors); every materializer starts it",
             ADMIN_RPC + "CreateMap", (), shapes.CreateMapBody, shapes.MapDefinition,
             status=201),
    Endpoint("GET", "/v1/maps/{map}/config", "get_map_config",
             "The map's section of the configuration", ADMIN_RPC + "GetMapConfig", (MAP,),
             answer=shapes.MapSection),
    Endpoint("PUT", "/v1/maps/{map}/config", "put_map_config",
             "Create the map or change it: only its queries restart (its indexes alone: none)",
             ADMIN_RPC + "PutMapConfig",
             (MAP, Param("rebuild", "query",
                         "let a change its state cannot follow through: rebuilt into a new "
                         "copy while the old one serves", {"type": "boolean"})),
             shapes.MapSection, shapes.MapDefinition),
    Endpoint("DELETE", "/v1/maps/{map}", "delete_map",
             "Stop the map and forget it; with purge, remove its data too",
             ADMIN_RPC + "DeleteMap",
             (MAP, Param("purge", "query",
                         "also remove its Redis keys, Delta tables, checkpoints, consumer group "
                         "and changelog topics once it stopped", {"type": "boolean"})),
             answer=shapes.MapDeleted),
    Endpoint(
        "GET", "/v1/maps/{map}/entities/{key}", "get_entity",
        "One entity and the map's watermark, or as the Delta table held it (as_of_*)",
        MAPS_RPC + "Get",
        (MAP, KEY, MIN_OFFSETS, TIMEOUT, AS_OF),
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
         Param("page_token", "query", "next_page_token of the page before",
               {"type": "string", "pattern": "^[A-Za-z0-9_-]*$"}),
         TABLE_MIN_OFFSETS,
         TIMEOUT),
        answer=shapes.QueryPage,
    ),
    Endpoint(
        "GET", "/v1/maps/{map}/changes", "changes",
        "The map's changes as Server-Sent Events, from now or after a change id",
        MAPS_RPC + "Watch",
        (MAP, Param("after", "query", "a change id; 0 for every retained change", CHANGE_ID),
         Param("include_entities", "query", "send upserted entities", {"type": "boolean"}),
         Param("keys", "query", "only these keys, comma-separated"),
         Param("where", "query", "only changes after which the entity matches this SQL "
               "filter, as Query's"),
         Param("include_left", "query", "with where: also the change after which an entity "
               "sent as matching no longer matches", {"type": "boolean"}),
         Param("Last-Event-ID", "header", "resume after this change (over 'after')",
               CHANGE_ID)),
        answer=SSE,
    ),
    Endpoint(
        "POST", "/v1/enrich", "enrich",
        "Newline-delimited JSON events in, enriched events out (one line each), streamed",
        "/materializer.v1.EnrichService/Enrich",
        (JOIN,
         MIN_OFFSETS,
         TIMEOUT,
         BATCH),
        NDJSON, NDJSON,
    ),
    Endpoint(
        "POST", "/v1/sql", "sql",
        "A SELECT or WITH statement over the maps: JSON rows, or NDJSON (streamed) or Arrow IPC "
        "(application/vnd.apache.arrow.stream) by the Accept header; the tables read, with "
        "their versions and watermarks, also in the Materializer-Tables header",
        SQL_RPC + "Execute",
        (Param("Accept", "header", "the answer's format; application/json by default",
               {"type": "string", "enum": [JSON, NDJSON, ARROW_STREAM]}),),
        shapes.SqlBody, (shapes.SqlAnswer, NDJSON, ARROW_STREAM),
    ),
    Endpoint("GET", "/v1/maps/{map}/schema", "get_schema",
             "The map's fields as its Delta table holds them, with the table version and time "
             "each field came in when the map gained it while it ran",
             MAPS_RPC + "GetSchema", (MAP,), answer=map_pb.GetSchemaResponse),
    Endpoint("GET", "/v1/maps/{map}/status", "status", "The map's state, lag and rates",
             ADMIN_RPC + "GetStatus", (MAP,), answer=admin_pb.MapStatus),
    Endpoint("PUT", "/v1/maps/{map}/pause", "pause", "Stop folding after the batch in flight",
             ADMIN_RPC + "Pause", (MAP,), answer=admin_pb.ControlResponse, status=202),
    Endpoint("PUT", "/v1/maps/{map}/resume", "resume", "Fold again from where it paused",
             ADMIN_RPC + "Resume", (MAP,), answer=admin_pb.ControlResponse, status=202),
    Endpoint("POST", "/v1/maps/{map}/restart", "restart", "Stop and start the map's queries",
             ADMIN_RPC + "Restart", (MAP,), answer=admin_pb.ControlResponse, status=202),
    Endpoint("POST", "/v1/maps/{map}/operations", "start_operation",
             "Ask the run that holds the map for a verify, rehydrate or rebuild (409 while "
             "one is under way, or when no materializer runs the map)",
             ADMIN_RPC + "StartOperation", (MAP,), shapes.OperationBody, admin_pb.Operation,
             status=202),
    Endpoint("GET", "/v1/maps/{map}/operations/last", "last_operation",
             "The last operation asked of the map, as its run reports it (404 if none)",
             ADMIN_RPC + "GetOperation", (MAP,), answer=admin_pb.Operation),
    Endpoint("PUT", "/v1/config/validate", "validate", "Check a configuration (YAML or JSON)",
             ADMIN_RPC + "ValidateConfig", (), YAML,
             admin_pb.ValidateConfigResponse),
    Endpoint("GET", "/healthz", "healthz", "The process is up"),
    Endpoint("GET", "/readyz", "readyz",
             "Redis answers (and the map, with ?map=, is not being restored): 200, else 503",
             params=(Param("map", "query", "one map's readiness (a map's name: else 400)",
                           {"type": "string", "pattern": MAP_NAME.pattern}),)),
    Endpoint("GET", "/openapi.json", "openapi", "This document", answer=JSON),
)  # fmt: skip
