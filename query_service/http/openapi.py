"""The OpenAPI 3.1 document of the HTTP front, built from ``endpoints.ENDPOINTS`` at start.

Paths and parameters come from the endpoint table the router serves, bodies
and answers from the pydantic models in ``shapes`` and from the protobuf
descriptors of the admin messages: nothing in it is written by hand, so it
cannot drift from what the server does.
"""

from __future__ import annotations

from typing import Any

import orjson
import pydantic
from google.protobuf.message import Message

from materializer import __version__
from query_service.http import shapes
from query_service.http.endpoints import ENDPOINTS, JSON, Endpoint

ERRORS = {
    "400": "a malformed request: the message names the field",
    "401": "no bearer token, or an unknown one",
    "403": "the token may not use this map or verb",
    "404": "no such map (or route)",
    "413": "more keys or bytes than the server takes at once",
    "503": "Redis does not answer, or the map is being restored: retry",
    "504": "the map did not reach min_offsets within timeout_ms",
}


def openapi_document() -> bytes:
    """The document as JSON."""
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    error = _schema(shapes.Error, schemas)
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
    return orjson.dumps(doc)


def _operation(endpoint: Endpoint, schemas: dict[str, Any], error: dict[str, Any]) -> Any:
    operation: dict[str, Any] = {
        "operationId": endpoint.name,
        "summary": endpoint.summary,
        "parameters": [
            {
                "name": p.name,
                "in": p.where,
                "description": p.description,
                "required": p.required,
                "schema": p.schema,
            }
            for p in endpoint.params
        ],
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
        operation["requestBody"] = {"required": True, "content": _content(endpoint.body, schemas)}
    return operation


def _content(shape: Any, schemas: dict[str, Any]) -> dict[str, Any]:
    if isinstance(shape, str):
        return {shape: {"schema": {"type": "string"}}}
    if issubclass(shape, Message):
        return {JSON: {"schema": shapes.message_schema(shape.DESCRIPTOR, schemas)}}
    return {JSON: {"schema": _schema(shape, schemas)}}


def _schema(model: type[pydantic.BaseModel], schemas: dict[str, Any]) -> dict[str, Any]:
    doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(doc.pop("$defs", {}))
    schemas[model.__name__] = doc
    return {"$ref": f"#/components/schemas/{model.__name__}"}
