"""The JSON the HTTP front takes and gives: the models its OpenAPI document is built from.

Entities are JSON objects here, not the bytes gRPC carries: an answer embeds
each entity's JSON as Redis holds it (``orjson.Fragment``, never parsed and
dumped again). The models validate request bodies (``extra="forbid"``, so a
misspelt field is an error naming it) and describe answers; the answers
themselves are written by ``routes`` straight from the gRPC responses, and a
test checks them against these models. Admin answers are the gRPC messages
in protobuf's JSON mapping, described by ``message_schema`` from the
descriptors themselves.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from pydantic import BaseModel, ConfigDict, Field, RootModel, StringConstraints, WithJsonSchema

from materializer.config import MAP_NAME
from materializer.contract.operations import KINDS
from materializer.contract.redis_layout import RESERVED_KEYS
from materializer.v1 import common_pb2

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
"""The largest values of the protobuf fields the numbers travel in: a larger one is a 400
naming its parameter or field, never an overflow deep in the call."""

TOPIC = r"[A-Za-z0-9._-]+"
PARTITION = r"[0-9]{1,9}"
OFFSET = r"[0-9]{1,18}"
"""A Kafka topic name, and a partition and an offset in digits that fit int32 and int64."""

KEY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "not": {"enum": sorted(RESERVED_KEYS)},
}
"""An entity key: not empty, and none of the names the map's Redis layout keeps for itself
(the server refuses those with a 400 naming the key)."""

_OFFSETS_SCHEMA = {
    "type": "object",
    "propertyNames": {"pattern": f"^{TOPIC}$"},
    "additionalProperties": {
        "type": "object",
        "propertyNames": {"pattern": f"^{PARTITION}$"},
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
    },
}
Offsets = Annotated[
    dict[
        Annotated[str, StringConstraints(pattern=f"^{TOPIC}$")],
        dict[
            Annotated[str, StringConstraints(pattern=f"^{PARTITION}$")],
            Annotated[int, Field(ge=0, le=INT64_MAX)],
        ],
    ],
    # pydantic would say patternProperties, which leave every other key allowed.
    WithJsonSchema(_OFFSETS_SCHEMA),
]
"""``{"topic": {"partition": next_offset}}``, as the Redis watermark holds them."""


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Watermark(_Shape):
    """How far the map was when it answered: its last batch and, per source partition, the
    next offset after what it folded."""

    batch_id: int
    offsets: Offsets
    updated_at: str | None = Field(None, description="RFC 3339, UTC; when the batch was written")


class Entity(_Shape):
    """One entity of a map."""

    key: str
    found: bool
    entity: dict[str, Any] | None = Field(None, description="the entity's JSON; null if not found")
    watermark: Watermark | None = None
    table_version: int | None = Field(
        None,
        description="set when the answer came from the map's Delta table, at this version, "
        "because Redis lost the map's copy and it is being written back",
    )


class EntityAsOf(_Shape):
    """One entity as the map's Delta table held it at a version or time."""

    key: str
    found: bool
    entity: dict[str, Any] | None = None
    table_version: int
    committed_at: str | None = Field(None, description="RFC 3339; when that version committed")
    watermark: Watermark | None = Field(
        None, description="the source offsets that version reflects; null: not recorded"
    )


class EntityLookup(RootModel[Entity | EntityAsOf]):
    """The answer of ``GET .../entities/{key}``: the entity with the map's watermark, or, with
    ``as_of_version`` or ``as_of_timestamp``, the entity as that version of the table held it."""


class BatchGetBody(_Shape):
    """Keys to look up in one call, and the positions the answer must reflect."""

    keys: list[Annotated[str, WithJsonSchema(KEY_SCHEMA)]]
    min_offsets: Offsets = Field(default_factory=dict, description="read-your-writes")
    timeout_ms: int | None = Field(
        None, gt=0, le=INT32_MAX, description="how long to wait for min_offsets"
    )


class BatchEntry(_Shape):
    """One key of a batch lookup."""

    key: str
    found: bool
    entity: dict[str, Any] | None = None


class BatchGetAnswer(_Shape):
    """One entry per key asked, in the order asked, and a watermark below them all."""

    entries: list[BatchEntry]
    watermark: Watermark | None = None
    table_version: int | None = Field(
        None, description="as Entity's: every entry came from the map's Delta table"
    )


class Row(_Shape):
    """One row of a query."""

    key: str
    entity: dict[str, Any]


class QueryPage(_Shape):
    """A page of a query's rows; ``next_page_token`` asks for the next."""

    rows: list[Row]
    next_page_token: str | None = None
    table_version: int
    watermark: Watermark | None = Field(
        None,
        description="the source offsets the rows reflect (TABLE: the version read, null when "
        "its commits record none; REDIS_INDEX: the Redis watermark read before the rows)",
    )
    source: Literal["TABLE", "REDIS_INDEX"] | None = Field(
        None, description="where the rows came from: the Delta table, or Redis through an index"
    )
    index: str | None = Field(None, description="the indexed field the rows were found by")


class ChangeEvent(_Shape):
    """The data of one Server-Sent Event of ``changes`` (its ``id`` is ``change_id``)."""

    change_id: str
    key: str
    op: Literal["upsert", "delete", "expire"]
    batch_id: int = Field(description="-1 for an expiry")
    entity: dict[str, Any] | None = Field(None, description="with include_entities, for upserts")
    left: bool = Field(
        False,
        description="with where and include_left: the entity matched before this change "
        "and does not after it",
    )


class EnrichedEvent(_Shape):
    """One line of an enrichment's answer, for the event at ``index`` (0-based)."""

    index: int
    event: dict[str, Any] | None = Field(None, description="the enriched event; null if dropped")
    dropped: bool = False
    error: str | None = None
    missed: list[str] = Field(default_factory=list, description="lookups that found no entity")


MapName = Annotated[str, StringConstraints(pattern=MAP_NAME.pattern)]

SCHEMA_OF = "x-schema-of"
"""Marks a schema as another model's (by name), which ``openapi`` adds to the document's
components and refers to: pydantic takes no reference to a model a field is not typed by."""

MAP_SECTION_SCHEMA = {
    SCHEMA_OF: "MapConfig",
    "description": "the map's section of the configuration file, as JSON; beyond its "
    "shape the server checks what a schema cannot say (a field that needs another, "
    "topics that exist, a change the map's state can follow) and answers 400 naming "
    "each key path it refuses; integers fit in 64 bits",
}
"""The configuration model's own schema; the server validates a section itself, so every
problem is named, not only the first."""

MapSectionJson = Annotated[dict[str, Any], WithJsonSchema(MAP_SECTION_SCHEMA)]


class MapSection(RootModel[MapSectionJson]):
    """A map's section of the configuration file."""


class CreateMapBody(_Shape):
    """A map to create, in Kafka Connect's ``POST /connectors`` shape."""

    name: MapName
    config: MapSectionJson


class MapDefinition(_Shape):
    """A map's definition as it stands after a change."""

    name: str
    config: MapSectionJson
    origin: Literal["file", "api"] = Field(
        description="file: declared in the configuration file; api: managed here"
    )
    version: int = Field(description="its version in the catalog, 0 for a map of the file")
    changed_by: str = Field(description="the name of the token of the last change")
    changed_at: str | None = Field(description="when, RFC 3339")
    created: bool = Field(description="this change created the map")
    rebuilding: bool = Field(
        description="this change is being rebuilt into a new copy; the old one serves meanwhile"
    )


class MapDeleted(_Shape):
    """A deleted map, and with ``purge`` what was removed."""

    name: str
    version: int = Field(description="the deletion's version in the catalog")
    purged: list[str] = Field(description="what the purge removed, one line each")


class OperationBody(_Shape):
    """An operation to ask of the run that holds the map."""

    kind: Annotated[str, WithJsonSchema({"type": "string", "enum": list(KINDS)})] = Field(
        description="verify: compare Redis with Delta and the changelog; rehydrate: load "
        "Redis from them; rebuild: fold the map again into a new generation"
    )


class ErrorDetail(_Shape):
    """What went wrong: the status, and a message that names the field or key at fault."""

    code: str = Field(description="the gRPC status name: NOT_FOUND, INVALID_ARGUMENT, ...")
    message: str


class Error(_Shape):
    """Every error answer."""

    error: ErrorDetail


class Health(_Shape):
    """Liveness or readiness."""

    status: Literal["SERVING", "NOT_SERVING"]


def watermark(mark: common_pb2.Watermark) -> dict[str, Any]:
    """A gRPC watermark as ``Watermark``'s JSON."""
    offsets: Offsets = {}
    for p in mark.offsets:
        offsets.setdefault(p.topic, {})[str(p.partition)] = p.offset
    out: dict[str, Any] = {"batch_id": mark.batch_id, "offsets": offsets}
    if mark.HasField("updated_at"):
        out["updated_at"] = mark.updated_at.ToJsonString()
    return out


def entity_json(raw: bytes) -> orjson.Fragment:
    """An entity's JSON as Redis holds it, embedded as is."""
    return orjson.Fragment(raw)


_SCALARS: dict[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_DOUBLE: {"type": "number"},
    FieldDescriptor.TYPE_FLOAT: {"type": "number"},
    FieldDescriptor.TYPE_INT64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_UINT64: {"type": "string", "format": "uint64"},
    FieldDescriptor.TYPE_SINT64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_FIXED64: {"type": "string", "format": "uint64"},
    FieldDescriptor.TYPE_SFIXED64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_UINT32: {"type": "integer", "format": "uint32"},
    FieldDescriptor.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_FIXED32: {"type": "integer", "format": "uint32"},
    FieldDescriptor.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BYTES: {"type": "string", "format": "byte"},
}


def message_schema(descriptor: Descriptor, schemas: dict[str, Any]) -> dict[str, Any]:
    """A ``$ref`` to the JSON Schema of a protobuf message in protobuf's JSON mapping (field
    names as in the .proto), adding it and the messages it uses to ``schemas``."""
    name = descriptor.full_name.rsplit(".", 1)[-1]
    shape = globals().get(name)
    if isinstance(shape, type) and issubclass(shape, BaseModel):
        # An HTTP shape of that name (Watermark) is other JSON: the message takes its full
        # name, or one would stand for the other wherever both are used.
        name = descriptor.full_name
    ref = {"$ref": f"#/components/schemas/{name}"}
    if name in schemas:
        return ref
    if descriptor.full_name == "google.protobuf.Timestamp":
        schemas[name] = {"type": "string", "format": "date-time"}
        return ref
    schemas[name] = {}  # a placeholder: recursive messages refer to themselves
    properties: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value = field.message_type.fields_by_name["value"]
            properties[field.name] = {
                "type": "object",
                "additionalProperties": _field_schema(value, schemas),
            }
            continue
        schema = _field_schema(field, schemas)
        repeated = field.is_repeated
        properties[field.name] = {"type": "array", "items": schema} if repeated else schema
    schemas[name] = {"type": "object", "properties": properties}
    return ref


def _field_schema(field: FieldDescriptor, schemas: dict[str, Any]) -> dict[str, Any]:
    if field.message_type is not None:
        return message_schema(field.message_type, schemas)
    if field.enum_type is not None:
        return {"type": "string", "enum": [v.name for v in field.enum_type.values]}
    return dict(_SCALARS[field.type])


SqlValue = None | bool | int | float | str
"""A bound parameter in JSON; timestamps and decimals as text, cast in the statement
(``$1::timestamp``)."""


def _word(word: str) -> str:
    """``word`` in any case, as a JSON Schema pattern (ECMA-262 has no case flag)."""
    return "".join(f"[{c.upper()}{c.lower()}]" for c in word)


SQL_QUERY = (
    "(^|[^A-Za-z0-9_$])("
    + "|".join(_word(w) for w in ("select", "with", "from", "values"))
    + ")([^A-Za-z0-9_$]|$)"
)
"""What every statement the service runs holds: a query's keyword (SELECT, WITH, FROM,
VALUES), as a word. The pattern says no more than that, as SQL is not a regular language:
text without one is refused by the server's parse too, and what else the parse refuses
is a 400 naming ``sql``."""


class SqlBody(_Shape):
    """One SELECT or WITH statement over the maps, each map a table by its name."""

    sql: str = Field(
        min_length=1,
        description="one query in PostgreSQL's syntax as DataFusion reads it: a SELECT or "
        "WITH statement, its set operations (UNION, INTERSECT, EXCEPT) and a query in "
        "parentheses included; parameters are $1, $2, ... Any other statement (INSERT, SET, "
        "EXPLAIN, a bare expression such as 0), a second statement, a table function or text "
        "that does not parse is refused with a 400 whose message starts with 'sql: '",
        json_schema_extra={"pattern": SQL_QUERY},
    )
    params: list[SqlValue] = Field(default_factory=list, description="the values of $1, $2, ...")
    min_offsets: Offsets = Field(
        default_factory=dict,
        description="read-your-writes: the tables reading these topics reflect these offsets",
    )
    limit: int = Field(
        0, ge=0, le=INT64_MAX, description="rows at most; 0: up to the server's query.sql.max_rows"
    )
    timeout_ms: int | None = Field(
        None, gt=0, le=INT32_MAX, description="the statement's deadline, min_offsets' wait included"
    )


class SqlColumn(_Shape):
    """A column of an answer: its name and its Arrow type."""

    name: str
    type: str


class TableRead(_Shape):
    """A table an answer read: the version, and the source offsets that version reflects."""

    map: str
    version: int = Field(description="the Delta table version read; -1 when from Redis")
    watermark: Watermark | None = None
    redis: bool = Field(
        False,
        description="answered from the Redis copy as Get is: a plain key lookup, or a "
        "statement one of the map's indexes narrows",
    )
    index: str = Field("", description="the field whose index was read, when one was")


class SqlAnswer(_Shape):
    """A statement's answer: its columns, its rows as objects (a name repeated in the
    answer gets ``_2``, ``_3``…), and the tables read. Decimals are strings, timestamps
    RFC 3339, binary base64."""

    columns: list[SqlColumn]
    rows: list[dict[str, Any]]
    tables: list[TableRead]
