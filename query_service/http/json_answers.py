"""The JSON of the answers that are not streamed, from the servicers' protobuf answers.

Admin answers go out in protobuf's JSON mapping (``message_response``); lookups,
map definitions and deletions are written to the ``shapes`` models the OpenAPI
document declares, entities as the JSON they are stored as.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from google.protobuf import json_format

from materializer.v1 import admin_service_pb2 as admin_pb
from query_service.http import shapes
from query_service.http.endpoints import JSON
from query_service.http.params import invalid


def json_response(body: Any, status: int = 200) -> web.Response:
    """``body`` as JSON."""
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON)


def message_response(message: Any, status: int = 200) -> web.Response:
    """A gRPC answer in protobuf's JSON mapping, field names as in the .proto."""
    doc = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json_response(doc, status)


def section_json(section: dict[str, Any]) -> str:
    """A map's section for the gRPC call; a number JSON readers cannot take is a 400."""
    try:
        return orjson.dumps(section).decode()
    except TypeError as exc:  # an integer beyond 64 bits, which the body's parser keeps
        raise invalid(f"config: {exc}: numbers must fit in 64 bits") from None


def definition(answer: admin_pb.MapDefinition) -> dict[str, Any]:
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


def entry(key: str, found: bool, raw: bytes) -> dict[str, Any]:
    """One key's lookup (``shapes.BatchEntry``): the entity as stored, None when not found."""
    return {"key": key, "found": found, "entity": shapes.entity_json(raw) if found else None}


class Watermarks:
    """``shapes.watermark`` of answers' watermarks as JSON, written once per watermark: the
    lookups of a moment share one."""

    KEPT = 64
    """Watermarks kept; past that the cache starts again (the maps have moved on)."""

    def __init__(self) -> None:
        self._marks: dict[bytes, orjson.Fragment] = {}

    def of(self, answer: Any) -> orjson.Fragment | None:
        """The watermark of ``answer`` (a lookup's, a page's), or None when it has none."""
        if answer is None or not answer.HasField("watermark"):
            return None
        wire = answer.watermark.SerializeToString()
        kept = self._marks.get(wire)
        if kept is None:
            if len(self._marks) > self.KEPT:
                self._marks.clear()
            kept = self._marks[wire] = orjson.Fragment(
                orjson.dumps(shapes.watermark(answer.watermark))
            )
        return kept
