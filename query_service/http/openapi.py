"""The OpenAPI 3.1 document of the HTTP front, built from ``endpoints.ENDPOINTS`` at start.

Paths and parameters come from the endpoint table the router serves, bodies
and answers from the pydantic models in ``shapes`` and from the protobuf
descriptors of the admin messages: nothing in it is written by hand, so it
cannot drift from what the server does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import pydantic
from google.protobuf.message import Message

from materializer import __version__
from materializer.config import MapConfig
from query_service.http import shapes
from query_service.http.endpoints import (
    ARROW_STREAM,
    ENDPOINTS,
    JSON,
    NDJSON,
    SSE,
    YAML,
    Endpoint,
    Param,
)

ERRORS = {
    "400": "a malformed request: the message names the field",
    "401": "no bearer token, or an unknown one",
    "403": "the token may not use this map or verb",
    "404": "no such map (or route)",
    "409": "a map of that name exists already, or the map cannot take an operation now "
    "(one is under way, or no materializer runs it)",
    "413": "more keys or bytes than the server takes at once",
    "503": "Redis does not answer, or the map is being restored: retry",
    "504": "the map did not reach min_offsets within timeout_ms",
}

_TEXT_SCHEMAS: dict[str, dict[str, Any]] = {
    JSON: {"type": "object"},
    NDJSON: {
        "type": "array",
        "items": {"type": "object"},
        "description": "JSON objects, one per line; their integers within 64 bits",
    },
    ARROW_STREAM: {
        "type": "string",
        "contentMediaType": ARROW_STREAM,
        "description": "Arrow IPC stream format: the schema, the record batches, the end "
        "marker (a stream cut short has none)",
    },
}
"""What an answer given by its media type holds, where a string would promise too much: any
text is not an NDJSON stream."""

_BODY_SCHEMAS: dict[str, dict[str, Any]] = {
    NDJSON: {
        **_TEXT_SCHEMAS[NDJSON],
        "minItems": 1,
        "description": "the events, JSON objects, one per line (at least one: a body without "
        "an event is a 400); their integers within 64 bits",
    },
    YAML: {
        "type": "object",
        "description": "a configuration document in YAML or JSON, its sections (kafka, "
        "redis, maps, ...) at the top: a mapping with problems is answered with them "
        "(valid: false), as is text the YAML parser cannot read; a document that is not a "
        "mapping (a string, a list, only comments) is a 400",
    },
}
"""What a body given by its media type holds. A schema describes the value its media type
decodes to, as OpenAPI has it: a YAML body's is the configuration's mapping, not its
text."""


def openapi_document() -> bytes:
    """The document as JSON."""
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    error = model_schema(shapes.Error, schemas)
    model_schema(MapConfig, schemas)  # what shapes.MAP_SECTION_SCHEMA stands for
    for endpoint in ENDPOINTS:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(
            endpoint, schemas, error
        )
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "Materializer query service",
            "version": __version__,
            "description": "Lookups, queries, change streams, enrichment and admin of "
            "materialized maps over HTTP/JSON; the same calls as the gRPC API.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    return orjson.dumps(_referred(doc))


def _referred(node: Any) -> Any:
    """``node`` with each ``shapes.SCHEMA_OF`` mark turned into a reference to its model."""
    if isinstance(node, list):
        return [_referred(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _referred(value) for key, value in node.items() if key != shapes.SCHEMA_OF}
    if shapes.SCHEMA_OF in node:
        out["allOf"] = [{"$ref": f"#/components/schemas/{node[shapes.SCHEMA_OF]}"}]
    return out


def _operation(endpoint: Endpoint, schemas: dict[str, Any], error: dict[str, Any]) -> Any:
    operation: dict[str, Any] = {
        "operationId": endpoint.name,
        "summary": endpoint.summary,
        "parameters": parameters(endpoint.params),
        "responses": {
            str(endpoint.status): {
                "description": "the answer",
                "content": _content(endpoint.answer, schemas),
            },
            **{
                code: {"description": text, "content": {JSON: {"schema": error}}}
                for code, text in ERRORS.items()
            },
        },
    }
    if endpoint.rpc is not None:
        operation["security"] = [{}, {"bearer": []}]
        operation["description"] = f"The gRPC method {endpoint.rpc.lstrip('/')}."
    if endpoint.body is not None:
        content = _content(endpoint.body, schemas, _BODY_SCHEMAS)
        operation["requestBody"] = {"required": True, "content": content}
    return operation


def parameters(params: Iterable[Param]) -> list[dict[str, Any]]:
    """The OpenAPI parameter objects of ``params``."""
    return [
        {
            "name": p.name,
            "in": p.where,
            "description": p.description,
            "required": p.required,
            "schema": p.schema,
        }
        for p in params
    ]


def _content(
    shape: Any, schemas: dict[str, Any], texts: dict[str, dict[str, Any]] = _TEXT_SCHEMAS
) -> dict[str, Any]:
    if isinstance(shape, tuple):
        return {media: c for one in shape for media, c in _content(one, schemas, texts).items()}
    if shape == SSE:
        return {SSE: {"schema": change_events(schemas)}}
    if isinstance(shape, str):
        return {shape: {"schema": texts.get(shape, {"type": "string"})}}
    if issubclass(shape, Message):
        return {JSON: {"schema": shapes.message_schema(shape.DESCRIPTOR, schemas)}}
    return {JSON: {"schema": model_schema(shape, schemas)}}


def change_events(schemas: dict[str, Any]) -> dict[str, Any]:
    """One Server-Sent Event of ``changes``, as OpenAPI before 3.2 describes a stream's items:
    a change, or the error that ends the stream, its JSON in ``data``."""
    data = {
        "oneOf": [model_schema(shapes.ChangeEvent, schemas), model_schema(shapes.Error, schemas)]
    }
    return {
        "type": "object",
        "properties": {
            "event": {"enum": ["change", "error"]},
            "id": {"type": "string", "description": "the change id, for Last-Event-ID"},
            "data": {"type": "string", "contentMediaType": JSON, "contentSchema": data},
        },
        "required": ["event", "data"],
    }


def model_schema(model: type[pydantic.BaseModel], schemas: dict[str, Any]) -> dict[str, Any]:
    """A reference to ``model``'s schema, added to ``schemas`` with those it refers to."""
    doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(doc.pop("$defs", {}))
    schemas[model.__name__] = doc
    return {"$ref": f"#/components/schemas/{model.__name__}"}
