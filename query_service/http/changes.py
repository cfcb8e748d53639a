"""A map's changes written as Server-Sent Events: the API's change stream and the console's.

``Watch`` answers batches of changes; each change becomes one event (``id`` the
change id, for ``Last-Event-ID``; ``data`` a ``shapes.ChangeEvent``). An idle
stream gets a comment line now and then, so proxies keep it open and a client
that went away is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from materializer.v1 import map_service_pb2 as map_pb
from query_service.http import shapes
from query_service.http.calls import HttpAbort, error_body
from query_service.http.endpoints import SSE

KEEPALIVE_S = 15.0
"""A comment line on an idle change stream: proxies keep it open, a gone client is noticed."""


async def sse_changes(
    request: web.Request,
    watch: Callable[[Callable[[], Awaitable[None]]], AsyncGenerator[Any, None]],
) -> web.StreamResponse:
    """A ``Watch`` stream written as Server-Sent Events (the API's and the console's).

    ``watch`` starts the call given what to do once the stream is positioned: the
    response starts then, so a refusal before it is still an error status.
    """
    response = web.StreamResponse(headers={"Content-Type": SSE, "Cache-Control": "no-cache"})

    async def opened() -> None:
        await response.prepare(request)

    stream = watch(opened)
    answers = _with_keepalives(stream, response)
    try:
        async for answer in answers:
            if answer is None:
                await response.write(b": keepalive\n\n")
                continue
            await response.write(b"".join(_sse(change) for change in answer.changes))
    except HttpAbort as exc:
        if not response.prepared:
            raise
        # Positioned, then ended (the stream trimmed past this watcher): said in the stream.
        await response.write(
            b"event: error\ndata: " + error_body(exc.code.name, exc.message) + b"\n\n"
        )
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the client went away
    finally:
        # The keepalives' pending read of the stream goes first: a generator that is
        # being read cannot be closed (a client gone during a keepalive made that a 500).
        await answers.aclose()
        await stream.aclose()
    return response


async def _with_keepalives(
    stream: AsyncIterator[Any], response: web.StreamResponse
) -> AsyncGenerator[Any, None]:
    """The stream's items, and None after each ``KEEPALIVE_S`` without one (once it is open)."""
    waiting: asyncio.Task[Any] | None = None
    try:
        while True:
            if waiting is None:
                waiting = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({waiting}, timeout=KEEPALIVE_S)
            if not done:
                if response.prepared:
                    yield None
                continue
            task, waiting = waiting, None
            try:
                yield task.result()
            except StopAsyncIteration:
                return
    finally:
        if waiting is not None:
            waiting.cancel()
            with contextlib.suppress(BaseException):
                await waiting


_OPS = {
    map_pb.Change.UPSERT: "upsert",
    map_pb.Change.DELETE: "delete",
    map_pb.Change.EXPIRE: "expire",
}


def _sse(change: map_pb.Change) -> bytes:
    data: dict[str, Any] = {
        "change_id": change.change_id,
        "key": change.key,
        "op": _OPS.get(change.op, "upsert"),
        "batch_id": change.batch_id,
    }
    if change.entity:
        data["entity"] = shapes.entity_json(change.entity)
    if change.left:
        data["left"] = True
    return b"id: %s\nevent: change\ndata: %s\n\n" % (change.change_id.encode(), orjson.dumps(data))
