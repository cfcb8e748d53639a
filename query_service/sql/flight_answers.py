"""What the Flight SQL port keeps between a client's calls: statements whose answers
wait for their ``DoGet`` or are being read, and prepared statements.

A statement holds its process from ``GetFlightInfo`` until its answer is read to the
end: an answer nobody comes for within ``UNREAD_SECONDS`` is stopped, and one being read
runs at most ``PREFETCH`` batches ahead of its reader, so a large answer is never held
whole. ``Answers`` lives on the event loop; ``Stream.next``, ``Stream.stop`` and
``PreparedStatements`` are called from the Flight server's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import grpc
import pyarrow as pa

from query_service.auth import Grant
from query_service.errors import (
    DeadlineExceeded,
    NotFound,
    QueryServiceError,
    StoreUnavailable,
)
from query_service.sql.executor import Param, SqlExecutor
from query_service.sql.flight_calls import INTERNAL, STOPPING

log = logging.getLogger(__name__)

UNREAD_SECONDS = 10.0
"""How long an answer waits for the ``DoGet`` of its ticket, by default (clients ask at
once; meanwhile it holds a statement process)."""
PREFETCH = 2
"""Batches read from the statement process ahead of the client."""
MAX_PREPARED = 1000
"""Prepared statements kept per process; past it the least recently used is forgotten."""
POLL_SECONDS = 0.05
"""How often a waiting Flight thread looks whether its call was cancelled."""


class Cancelled(QueryServiceError):
    """The client cancelled the call, or its deadline passed."""

    code = grpc.StatusCode.CANCELLED


class CallContext(Protocol):
    """What a waiting thread needs of a Flight call (``pyarrow.flight.ServerCallContext``)."""

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the call or its deadline passed."""


class Stream:
    """One statement, run and read in one task of the event loop, into a small queue a
    Flight thread drains.

    One task, because the executor bounds a statement's time in the task that starts
    it: the task runs the statement, waits for its reader (``UNREAD_SECONDS`` at most),
    then reads the answer ``PREFETCH`` batches ahead of it, and closes the answer in
    every case.
    """

    def __init__(
        self,
        executor: SqlExecutor,
        text: str,
        params: Sequence[Param],
        grant: Grant | None,
        late: str,
        unread_seconds: float,
    ) -> None:
        self.grant = grant
        self.schema = pa.schema([])
        self._late = late
        self._unread_seconds = unread_seconds
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[pa.RecordBatch | QueryServiceError | None] = (
            queue.SimpleQueue()
        )
        self._credits = asyncio.Semaphore(PREFETCH)
        self._claimed = asyncio.Event()
        self._started: asyncio.Future[pa.Schema] = self._loop.create_future()
        self._stop_reason: QueryServiceError | None = None
        self.task = self._loop.create_task(self._run(executor, text, params))
        self.task.add_done_callback(self._ended)

    async def started(self) -> pa.Schema:
        """The answer's schema, once the statement started; its refusal if it did not."""
        try:
            return await asyncio.shield(self._started)
        except asyncio.CancelledError:
            self._started.add_done_callback(lambda f: f.cancelled() or f.exception())
            self.task.cancel()
            raise

    def _ended(self, _: asyncio.Task[None]) -> None:
        if not self._started.done():  # cancelled before the statement started
            self._started.cancel()

    def claim(self) -> None:
        """Its reader came: the answer may be read."""
        self._claimed.set()

    async def _run(self, executor: SqlExecutor, text: str, params: Sequence[Param]) -> None:
        try:
            answer = await executor.execute(text, params)
        except Exception as exc:
            self._started.set_exception(exc)
            return
        self.schema = answer.schema
        self._started.set_result(answer.schema)
        end: QueryServiceError | None = None
        try:
            if await self._reader_came():
                batches = cast(AsyncGenerator[tuple[pa.RecordBatch, bytes], None], answer.batches())
                async with contextlib.aclosing(batches):
                    async for batch, _ in batches:
                        await self._credits.acquire()
                        self._queue.put(batch)
            else:
                log.info("an Arrow Flight SQL answer was not read in %g s", self._unread_seconds)
                end = NotFound(unread(self._unread_seconds))
        except asyncio.CancelledError:
            # Ours (``stop``), or the statement's deadline, which cancels this task.
            end = self._stop_reason or DeadlineExceeded(self._late)
        except QueryServiceError as exc:
            end = exc
        except Exception:
            log.exception("reading a SQL answer for Arrow Flight SQL failed")
            end = QueryServiceError(INTERNAL)
        self._queue.put(end)  # first: the reader is done whatever closing the answer takes
        await answer.close()

    async def _reader_came(self) -> bool:
        try:
            async with asyncio.timeout(self._unread_seconds):
                await self._claimed.wait()
        except TimeoutError:
            return False
        return True

    def next(self, context: CallContext) -> pa.RecordBatch | None:
        """The next batch, ``None`` at the end; from a Flight thread, which waits for it."""
        while True:
            try:
                item = self._queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if context.is_cancelled():
                    raise Cancelled("the client cancelled the call") from None
                continue
            if isinstance(item, QueryServiceError):
                raise item
            if item is not None:
                _threadsafe(self._loop, self._credits.release)
            return item

    def stop(self, reason: QueryServiceError | None = None) -> None:
        """Stop the statement, from any thread; a waiting ``next`` raises ``reason``."""
        self._stop_reason = reason or Cancelled("the client stopped reading")
        _threadsafe(self._loop, self.task.cancel)


class Answers:
    """Statements whose answers wait for their ``DoGet`` (by ticket) or are being read;
    on the event loop."""

    def __init__(
        self, executor: SqlExecutor, late: str, unread_seconds: float = UNREAD_SECONDS
    ) -> None:
        self._executor = executor
        self._late = late
        self._unread_seconds = unread_seconds
        self._unread: dict[bytes, Stream] = {}
        self._streams: set[Stream] = set()

    async def run(
        self, text: str, params: Sequence[Param], grant: Grant | None
    ) -> tuple[bytes, pa.Schema]:
        """Start the statement: the ticket its answer waits under, and the answer's schema."""
        stream = Stream(self._executor, text, params, grant, self._late, self._unread_seconds)
        self._streams.add(stream)
        stream.task.add_done_callback(lambda _: self._streams.discard(stream))
        schema = await stream.started()
        ticket = secrets.token_bytes(16)
        self._unread[ticket] = stream
        stream.task.add_done_callback(lambda _: self._unread.pop(ticket, None))
        return ticket, schema

    async def schema_of(self, text: str, params: Sequence[Param]) -> pa.Schema:
        """An answer's schema, without keeping an answer: the statement runs for one row
        and is read to its end (which leaves its process free for the next)."""
        answer = await self._executor.execute(text, params, limit=1)
        try:
            async for _ in answer.batches():
                pass
        finally:
            await answer.close()
        return answer.schema

    async def schema(self, ticket: bytes, grant: Grant | None) -> pa.Schema:
        """The schema of the answer waiting under ``ticket``."""
        return self._find(ticket, grant).schema

    async def stream(self, ticket: bytes, grant: Grant | None) -> Stream:
        """The answer under ``ticket``, to read; the ticket is spent."""
        stream = self._find(ticket, grant)
        del self._unread[ticket]
        stream.claim()
        return stream

    def _find(self, ticket: bytes, grant: Grant | None) -> Stream:
        stream = self._unread.get(ticket)
        if stream is None or stream.grant != grant:
            raise NotFound(unread(self._unread_seconds))
        return stream

    async def close(self) -> None:
        """Stop every statement, read or not: their readers fail with UNAVAILABLE."""
        streams = list(self._streams)
        for stream in streams:
            stream.stop(StoreUnavailable(STOPPING))
        await asyncio.gather(*(s.task for s in streams), return_exceptions=True)


@dataclass
class Prepared:
    """A prepared statement: its text, parameter count, owner, and the values bound."""

    text: str
    parameters: int
    grant: Grant | None
    params: list[Param] = field(default_factory=list)


class PreparedStatements:
    """Prepared statements by handle, for the Flight threads (see ``MAX_PREPARED``), and
    the answer schema each statement text had when it last ran, which a client is told
    when it prepares the text again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[bytes, Prepared] = OrderedDict()
        self._schemas: OrderedDict[str, pa.Schema] = OrderedDict()

    def add(self, prepared: Prepared) -> bytes:
        """Keep a statement; its handle."""
        handle = secrets.token_bytes(16)
        with self._lock:
            self._items[handle] = prepared
            while len(self._items) > MAX_PREPARED:
                self._items.popitem(last=False)
        return handle

    def get(self, handle: bytes, grant: Grant | None) -> Prepared:
        """The statement of ``handle``, if ``grant`` prepared it."""
        with self._lock:
            prepared = self._items.get(handle)
            if prepared is None or prepared.grant != grant:
                raise NotFound(
                    "no such prepared statement: it was closed, or forgotten as the "
                    f"{MAX_PREPARED} most recently used were kept; prepare it again"
                )
            self._items.move_to_end(handle)
            return prepared

    def close(self, handle: bytes, grant: Grant | None) -> None:
        """Forget a statement (closing an unknown handle is not an error)."""
        with self._lock:
            prepared = self._items.get(handle)
            if prepared is not None and prepared.grant == grant:
                del self._items[handle]

    def ran(self, text: str, schema: pa.Schema) -> None:
        """Remember the answer schema of a statement text (the ``MAX_PREPARED`` latest)."""
        with self._lock:
            self._schemas[text] = schema
            self._schemas.move_to_end(text)
            while len(self._schemas) > MAX_PREPARED:
                self._schemas.popitem(last=False)

    def schema(self, text: str) -> pa.Schema | None:
        """The answer schema the text had when it last ran here, if it did."""
        with self._lock:
            return self._schemas.get(text)


def unread(seconds: float) -> str:
    """Why a ticket finds no answer."""
    return (
        "no answer waits under this ticket: it was read already, or not read within "
        f"{seconds:g} s of its statement; run the statement again"
    )


def _threadsafe(loop: asyncio.AbstractEventLoop, callback: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is left to stop
        loop.call_soon_threadsafe(callback)
