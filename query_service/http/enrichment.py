"""The enrichment's NDJSON: a body of events read in batches, enriched lines written back.

The body is read line by line and sent to ``Enrich`` as requests of ``batch``
events each, so a long body streams through without being held whole; each
answer is written as it comes, one line per event, with the event's index in
the body (``shapes.EnrichedEvent``). An error after the first line is the
stream's last line, as the status has gone out. A body without an event is a 400.

The body's problems are raised as the servicer's own errors: the request stream is
read inside the call, whose error mapping turns them into their status.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

from materializer.v1 import enrich_service_pb2 as enrich_pb
from query_service.errors import InvalidArgument, ResourceExhausted
from query_service.http import shapes
from query_service.http.calls import HttpAbort, error_body
from query_service.http.endpoints import NDJSON

ENRICH_BATCH = 500
"""Events per request of the enrichment an NDJSON body becomes, unless ``batch`` says."""
MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest NDJSON event line taken; the gRPC message limit."""
NO_EVENTS = "body: no events; send the events to enrich as NDJSON, one JSON object per line"

Enrich = Callable[
    [AsyncIterator[enrich_pb.EnrichRequest]], AsyncGenerator[enrich_pb.EnrichResponse, None]
]
"""The ``Enrich`` call, given its requests."""


async def enrich_ndjson(
    request: web.Request, first: enrich_pb.EnrichRequest, batch: int, enrich: Enrich
) -> web.StreamResponse:
    """``enrich`` of the request's body, ``first`` the join and freshness, ``batch`` events
    per request; answered line by line as the lookups go."""
    starts: list[int] = []
    """The index in the body of each request's first event, by its ``request_id``."""

    async def requests() -> AsyncIterator[enrich_pb.EnrichRequest]:
        pending = first
        events: list[bytes] = []
        seen = 0
        while True:
            try:
                line = await request.content.readline(max_line_length=MAX_LINE_BYTES)
            except LineTooLong:
                raise ResourceExhausted(
                    f"line {seen + len(events) + 1}: longer than {MAX_LINE_BYTES} bytes"
                ) from None
            if line.strip():
                events.append(line.strip())
            if events and (len(events) >= batch or not line):
                pending.events.extend(events)
                pending.request_id = str(len(starts))
                starts.append(seen)
                seen += len(events)
                events = []
                yield pending
                pending = enrich_pb.EnrichRequest()
            if not line:
                if not starts:
                    # As the document says: the body is required, and a body without an
                    # event asks for nothing (an empty file sent, a pipe cut before its
                    # first line): told, not answered with an empty stream.
                    raise InvalidArgument(NO_EVENTS)
                return

    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    answers = enrich(requests())
    try:
        async for answer in answers:
            if not response.prepared:
                await response.prepare(request)
            start = starts[int(answer.request_id)]
            await response.write(b"".join(_enriched(start, e) for e in answer.events))
    except HttpAbort as exc:
        if not response.prepared:
            raise
        await response.write(error_body(exc.code.name, exc.message) + b"\n")
    finally:
        await answers.aclose()
    if not response.prepared:
        await response.prepare(request)  # no answer came: still a well-formed empty stream
    await response.write_eof()
    return response


def _enriched(start: int, event: enrich_pb.EnrichedEvent) -> bytes:
    line: dict[str, Any] = {"index": start + event.index}
    enriched = event.event and not event.dropped and not event.error
    line["event"] = shapes.entity_json(event.event) if enriched else None
    if event.dropped:
        line["dropped"] = True
    if event.error:
        line["error"] = event.error
    if event.missed:
        line["missed"] = list(event.missed)
    return orjson.dumps(line) + b"\n"
