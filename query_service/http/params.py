"""What a handler reads from a request: query parameters and JSON bodies, checked.

A malformed value is an ``INVALID_ARGUMENT`` naming the parameter or field
(400 over HTTP), raised before the servicer method is called, so a client
learns which part of its request to fix rather than meeting a protobuf or
pydantic error.
"""

from __future__ import annotations

import re
from typing import Any

import grpc
import pydantic
import yaml
from aiohttp import web

from materializer.v1 import common_pb2 as common
from query_service.http import shapes
from query_service.http.calls import HttpAbort
from query_service.http.endpoints import CHANGE_ID, OFFSETS_ITEM, TIMEOUT, Param

_OFFSETS_ITEM = re.compile(OFFSETS_ITEM)
_CHANGE_ID = re.compile(CHANGE_ID["pattern"])


def invalid(message: str) -> HttpAbort:
    """A 400 whose message names what was wrong, as a servicer's own check would say it."""
    return HttpAbort(grpc.StatusCode.INVALID_ARGUMENT, message)


def int_param(request: web.Request, param: Param) -> int | None:
    """An integer query parameter within the bounds its OpenAPI schema declares; None when
    absent or empty, so the method's default holds."""
    name = param.name
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise invalid(f"{name}: not an integer: {raw!r}") from None
    minimum, maximum = param.schema.get("minimum"), param.schema.get("maximum")
    if minimum is not None and value < minimum:
        raise invalid(f"{name}: must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise invalid(f"{name}: must be at most {maximum}")
    return value


def bool_param(request: web.Request, name: str) -> bool:
    """A boolean query parameter: false unless given; anything but true or false (the
    document's boolean, as a query string writes it) is a 400."""
    raw = request.query.get(name, "false")
    if raw not in ("true", "false"):
        raise invalid(f"{name}: true or false, not {raw!r}")
    return raw == "true"


def list_param(request: web.Request, name: str) -> list[str]:
    """A list query parameter, comma-separated or repeated, as a URL has no better form."""
    return [v for raw in request.query.getall(name, []) for v in raw.split(",") if v]


def timeout_param(request: web.Request) -> float | None:
    """``timeout_ms`` in seconds, the unit of a gRPC deadline; None for no deadline."""
    ms = int_param(request, TIMEOUT)
    return None if ms is None else ms / 1000


def offsets_param(raw: str | None) -> list[common.PartitionOffset]:
    """``topic:partition:offset,...`` (Kafka topic names hold no ``:``)."""
    out = []
    for item in (raw or "").split(","):
        if not item:
            continue
        if not _OFFSETS_ITEM.fullmatch(item):
            raise invalid(f"min_offsets: {item!r} is not topic:partition:offset")
        topic, partition, offset = item.split(":")
        out.append(
            common.PartitionOffset(topic=topic, partition=int(partition), offset=int(offset))
        )
    return out


def body_offsets(offsets: shapes.Offsets) -> list[common.PartitionOffset]:
    """A JSON body's ``min_offsets``: JSON object keys are strings, partitions are numbers."""
    try:
        return [
            common.PartitionOffset(topic=t, partition=int(p), offset=o)
            for t, parts in offsets.items()
            for p, o in parts.items()
        ]
    except ValueError:
        raise invalid("min_offsets: partitions are numbers") from None


async def json_body(request: web.Request, model: type[shapes._Shape]) -> Any:
    """The JSON body validated by ``model``; an error names the field."""
    raw = await request.read()
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"]) or "body"
        raise invalid(f"{where}: {problem['msg']}") from None


def change_id_param(request: web.Request) -> str:
    """Where a change stream resumes: ``Last-Event-ID`` (a browser's ``EventSource`` sends it
    on reconnecting), else ``after``; a value that is not a change id is a 400 naming the
    one it came from. A header is any bytes, which no protobuf string may carry."""
    name, value = "Last-Event-ID", request.headers.get("Last-Event-ID")
    if not value:
        name, value = "after", request.query.get("after", "")
    if not _CHANGE_ID.fullmatch(value):
        raise invalid(f"{name}: {value!r} is not a change id (such as 1700000000000-0, or 0)")
    return value


async def config_body(request: web.Request) -> str:
    """A configuration document to validate: YAML or JSON whose top is a mapping, as the
    document's schema of the body says. What is not a configuration at all (a string, a
    list, only comments) is a 400; a mapping's problems are the validation's answer, and so
    is text that is not YAML (the parser's message says where). An empty body is the
    servicer's own 400."""
    raw = await request.read()
    try:
        text = raw.decode(request.charset or "utf-8")
    except (UnicodeDecodeError, LookupError) as exc:
        raise invalid(f"config: not text in {request.charset or 'utf-8'}: {exc}") from None
    if text.strip() and not _is_mapping(text):
        raise invalid(
            "config: not a mapping; send a configuration document (YAML or JSON), its "
            "sections (kafka, redis, maps, ...) at the top"
        )
    return text


def _is_mapping(text: str) -> bool:
    """Whether the document's top node is a mapping, from the parser's first events only:
    the servicer parses the whole document."""
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.NodeEvent):
                return isinstance(event, yaml.MappingStartEvent)
    except yaml.YAMLError:
        return True  # not YAML: the servicer reports the parser's problem
    return False  # no document, or only comments
