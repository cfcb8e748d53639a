"""``POST /v1/sql``'s answers in the formats the Accept header picks.

- ``application/json`` (the default): ``shapes.SqlAnswer``, the whole answer at once,
  so an error at any point is the answer's status.
- ``application/x-ndjson``: one row object per line, written as the batches come;
  an error after the first row is a last line ``{"error": {...}}``.
- ``application/vnd.apache.arrow.stream``: the engine's Arrow IPC stream as it is;
  an error after the first bytes cuts the connection, so a reader never takes a
  shortened stream for a whole one.

The tables read, with versions and watermarks, are known before the first row: the
streamed formats carry them in the ``Materializer-Tables`` header.

The JSON answer's shape (``rows``, ``table_json``, ``dumps``), a value's text in a
cell (``text_of``) and the typing of a parameter given as text (``text_param``) are the
console's and the CLI's too.
"""

from __future__ import annotations

import asyncio
import base64
import re
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import grpc
import orjson
import pyarrow as pa
from aiohttp import web

from materializer.v1 import sql_service_pb2 as sql_pb
from query_service.client import sql_param as wire_param
from query_service.errors import QueryServiceError
from query_service.http import shapes
from query_service.http.calls import HttpAbort, error_body, error_response
from query_service.http.endpoints import ARROW_STREAM, JSON, NDJSON
from query_service.sql.executor import Answer, TableRead

TABLES_HEADER = "Materializer-Tables"
CLIENT_CHECK_SECONDS = 0.25
"""How often a statement's answer looks whether its client is still there."""
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The end-of-stream marker of Arrow's IPC stream format."""
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def answer_format(accept: str | None) -> str:
    """The media type to answer in: the first of ours the Accept header names."""
    for part in (accept or JSON).split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media in (JSON, NDJSON, ARROW_STREAM):
            return media
        if media in ("*/*", "application/*", ""):
            return JSON
    raise HttpAbort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"Accept: {accept!r}; answers are {JSON}, {NDJSON} or {ARROW_STREAM}",
    )


def sql_param(value: shapes.SqlValue, index: int) -> sql_pb.SqlParam:
    """A JSON parameter in its wire form, as the client makes it; 400 naming it when it
    has none (an integer beyond 64 bits)."""
    try:
        return wire_param(value)
    except ValueError as exc:
        raise HttpAbort(grpc.StatusCode.INVALID_ARGUMENT, f"params[{index}]: {exc}") from None


def text_param(text: str) -> shapes.SqlValue:
    """A parameter typed as text, as the CLI's ``--param`` and the console take one: a JSON
    number, ``true``, ``false``, ``null`` or a JSON string (``"42"`` stays text); anything
    else is the text as it is. An integer stays exact, however long (one past 64 bits
    is refused by ``sql_param``, not rounded to a float)."""
    if _INTEGER.fullmatch(text.strip()):
        return int(text)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return text


async def write_answer(request: web.Request, answer: Answer, media: str) -> web.StreamResponse:
    """The answer in ``media``; the statement is stopped if the client goes away."""
    watch = asyncio.ensure_future(_client_gone(request, asyncio.current_task()))
    try:
        if media == JSON:
            return await _json(answer)
        response = web.StreamResponse(
            headers={"Content-Type": media, TABLES_HEADER: orjson.dumps(tables(answer)).decode()}
        )
        if media == NDJSON:
            await _ndjson(request, response, answer)
        else:
            await _arrow(request, response, answer)
        return response
    finally:
        watch.cancel()
        await answer.close()


async def _client_gone(request: web.Request, reader: asyncio.Task[Any] | None) -> None:
    """Cancel ``reader`` once the client's connection closes.

    A statement computes for a while before its first batch, when nothing is written
    that would fail; the reader's cancellation ends the statement's process. The answer
    is read in the task that started the statement: its deadline belongs to that task.
    """
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(CLIENT_CHECK_SECONDS)
    if reader is not None:
        reader.cancel()


def tables(answer: Answer) -> list[dict[str, Any]]:
    """The tables read, as ``shapes.TableRead``."""
    return [table_json(t) for t in answer.tables]


def table_json(table: TableRead) -> dict[str, Any]:
    """One table read, as ``shapes.TableRead``."""
    mark = table.watermark
    watermark = None
    if mark is not None:
        watermark = {
            "batch_id": mark.batch_id,
            "offsets": {
                topic: {str(p): o for p, o in sorted(parts.items())}
                for topic, parts in sorted(mark.offsets.items())
            },
            "updated_at": _iso_ms(mark.updated_at_ms) if mark.updated_at_ms else None,
        }
    return {
        "map": table.map_name,
        "version": table.version,
        "watermark": watermark,
        "redis": table.redis,
    }


async def _json(answer: Answer) -> web.Response:
    try:
        all_rows = [row async for batch, _ in answer.batches() for row in rows(batch)]
    except QueryServiceError as exc:
        return error_response(exc.code, str(exc))
    body = {"columns": columns(answer.schema), "rows": all_rows, "tables": tables(answer)}
    return web.Response(body=dumps(body), content_type=JSON)


async def _ndjson(request: web.Request, response: web.StreamResponse, answer: Answer) -> None:
    await response.prepare(request)
    try:
        async for batch, _ in answer.batches():
            lines = [dumps(row) for row in rows(batch)]
            await response.write(b"\n".join(lines) + b"\n")
    except QueryServiceError as exc:
        await response.write(error_body(exc.code.name, str(exc)) + b"\n")
    await response.write_eof()


async def _arrow(request: web.Request, response: web.StreamResponse, answer: Answer) -> None:
    await response.prepare(request)
    await response.write(answer.schema_message)
    try:
        async for _, message in answer.batches():
            await response.write(message)
    except QueryServiceError:
        # A stream cut short must not read as a whole one: no end marker, no final chunk.
        if request.transport is not None:
            request.transport.close()
        return
    await response.write(_EOS)
    await response.write_eof()


def columns(schema: pa.Schema) -> list[dict[str, str]]:
    """Each column's answer name (``_names``) and Arrow type."""
    return [
        {"name": name, "type": str(field.type)}
        for name, field in zip(_names(schema), schema, strict=True)
    ]


def _names(schema: pa.Schema) -> list[str]:
    """The column names, a repeated one numbered (``_key``, ``_key_2``): a JSON object
    holds a name once, and a join of two maps repeats ``_key``."""
    seen: dict[str, int] = {}
    names = []
    for name in schema.names:
        count = seen.get(name, 0) + 1
        seen[name] = count
        names.append(name if count == 1 else f"{name}_{count}")
    return names


def rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The batch's rows as objects keyed by their answer names (``_names``)."""
    names = _names(batch.schema)
    values = [_pylist(column) for column in batch.columns]
    return [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]


def _pylist(column: pa.Array) -> list[Any]:
    try:
        values: list[Any] = column.to_pylist()
    except OverflowError:
        # A date or time outside Python's years 1 to 9999: Arrow's own text of it.
        values = column.cast(pa.string()).to_pylist()
    return values


def text_of(value: Any) -> str:
    """A value as a person reads it in a cell (the console's table, the CLI's table and
    CSV): text as it is, binary as base64, decimals exactly, times in ISO 8601, nested
    values as JSON; SQL NULL as ``null``."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return dumps(value).decode()


def dumps(body: Any) -> bytes:
    """JSON of an answer or a part of it: decimals as text, binary as base64 (``_value``)."""
    return orjson.dumps(body, default=_value, option=orjson.OPT_PASSTHROUGH_DATACLASS)


def _value(value: Any) -> Any:
    """What orjson cannot write: decimals exactly, as text; bytes as base64; a
    nanosecond timestamp (pandas' ``datetime`` subclass, which ``now()`` gives) in
    ISO 8601 with its nanoseconds; an interval as its months, days and nanoseconds."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, pa.MonthDayNano):
        return {"months": value.months, "days": value.days, "nanoseconds": value.nanoseconds}
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
