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

The JSON answer's parts, a value's text in a cell and a parameter typed from text are
``query_service.sql_text``'s, which the CLI reaches beside the client.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import orjson
from aiohttp import web

from materializer.v1 import sql_service_pb2 as sql_pb
from query_service import client, sql_text
from query_service.client import sql_param as wire_param
from query_service.errors import QueryServiceError
from query_service.http import shapes
from query_service.http.calls import HttpAbort, error_body, error_response
from query_service.http.endpoints import ARROW_STREAM, JSON, NDJSON
from query_service.sql.executor import Answer, TableRead
from query_service.sql_text import columns, dumps, rows

TABLES_HEADER = "Materializer-Tables"
CLIENT_CHECK_SECONDS = 0.25
"""How often a statement's answer looks whether its client is still there."""
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The end-of-stream marker of Arrow's IPC stream format."""


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
    """One table read, as ``shapes.TableRead``: in the client's form, which
    ``sql_text.table_json`` writes for the CLI too."""
    mark = table.watermark
    watermark = None
    if mark is not None:
        offsets = {(t, p): o for t, parts in mark.offsets.items() for p, o in parts.items()}
        watermark = client.Watermark(mark.batch_id, offsets, mark.updated_at_ms)
    read = client.TableRead(table.map_name, table.version, watermark, table.redis, table.index)
    return sql_text.table_json(read)


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
