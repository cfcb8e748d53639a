"""One pipelined connection to a Redis server for lookups: a command is written in the
event-loop turn it is asked for, and its reply is matched to it by order.

Why not redis-py's asyncio client for this path: per command it takes a
connection from its pool, wraps the reply's read in a timeout task and parses
through a stream reader, a CPU cost per lookup close to what the bare gRPC server
spends on the whole call. The same read through this connection, packed and parsed
by hiredis, costs a fraction of that
(docs/decisions/0010-lookups-down-one-pipelined-connection.md).
The commands of one loop turn go out in one write: an HTTP front handed many
requests in a turn, or a BatchGet beside Gets, costs Redis and the kernel one
read and one write for all of them instead of one each
(docs/decisions/0013-one-write-per-loop-turn.md).

Redis executes one connection's commands in the order they arrive and answers
them in that order, so the replies are matched first in, first out, and two
commands written one after the other run in that order: a lookup writes its
watermark read before its entity read, and the watermark is a lower bound of
the entity without waiting for it first.

redis-py still makes the connection (address or socket path, TLS, ``AUTH``,
``SELECT``, the protocol version, all from the URL), then hands its transport
over to this protocol. A lost connection fails the commands in flight with
``ConnectionError``, a reply later than the timeout fails them with
``TimeoutError`` and drops the connection (a late reply can never reach a later
command), and the next command connects again.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

_PARTIAL = object()
"""What the parser answers while no whole reply is buffered (``False`` is a RESP3 reply)."""
_PUSH = getattr(hiredis, "PushNotification", ())
"""A RESP3 push (``protocol=3``): the server's own message, not the answer to a command."""


class Replies(asyncio.Protocol):
    """One connection's commands in flight: each parsed reply completes the oldest."""

    def __init__(self, where: str, timeout: float) -> None:
        self.where = where
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.lost = False
        # redis-py's error classes: a server still loading its data answers BusyLoadingError,
        # a ConnectionError, which callers take as "unavailable, retry", as they would from
        # redis-py's own client.
        self._reader = hiredis.Reader(replyError=BaseParser.parse_error, notEnoughData=_PARTIAL)
        self._waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._unwritten: list[bytes] = []

    def send(self, *command: Any) -> asyncio.Future[Any]:
        """Write one command at the end of this loop turn, after the ones sent before it;
        its future gets the reply, or the connection's failure.

        Awaiting it is the caller's: a command written is answered whether or
        not anyone still waits for it.
        """
        packed = hiredis.pack_command(command)  # a bad argument raises here, before any write
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self.lost or self.transport is None:
            future.set_exception(RedisConnectionError(f"connection to {self.where} lost"))
            return future
        self._waiting.append((future, time.monotonic()))
        if not self._unwritten:
            loop.call_soon(self._write)
        self._unwritten.append(packed)
        if self._timer is None:
            self._timer = loop.call_later(self.timeout, self._expire)
        return future

    def _write(self) -> None:
        """The commands of the turn, in the order they were sent (none once lost: they failed)."""
        unwritten, self._unwritten = self._unwritten, []
        if not self.lost and self.transport is not None:
            self.transport.write(b"".join(unwritten))

    def data_received(self, data: bytes) -> None:
        """Every whole reply in ``data`` answers the oldest command still waiting; a reply
        whose caller gave up is dropped in its turn, so the order holds."""
        self._reader.feed(data)
        waiting = self._waiting
        while True:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                self.fail(RedisConnectionError, f"unreadable reply from {self.where}: {exc}")
                return
            if reply is _PARTIAL:
                return
            if isinstance(reply, _PUSH):
                continue
            if not waiting:
                self.fail(RedisConnectionError, f"a reply no command asked for from {self.where}")
                return
            future, _ = waiting.popleft()
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        """Every command in flight fails; the next one connects again."""
        cause = f": {exc}" if exc else ""
        self.fail(RedisConnectionError, f"connection to {self.where} lost{cause}")

    def _expire(self) -> None:
        """Fail everything in flight once the oldest command has waited too long."""
        self._timer = None
        if not self._waiting:
            return
        overdue = self._waiting[0][1] + self.timeout - time.monotonic()
        if overdue <= 0:
            self.fail(RedisTimeoutError, f"no reply from {self.where} in {self.timeout:g} s")
        else:
            self._timer = asyncio.get_running_loop().call_later(overdue, self._expire)

    def fail(self, error: type[Exception], message: str) -> None:
        """Fail every command in flight (each with an error of its own) and drop the
        connection at once: no reply to them can come later."""
        self.lost = True
        self._unwritten.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._waiting:
            future, _ = self._waiting.popleft()
            if not future.done():
                future.set_exception(error(message))
        if self.transport is not None:
            self.transport.abort()


class LookupConnection:
    """Commands of the lookups of one process to one Redis server, over one connection."""

    def __init__(self, pool: aioredis.ConnectionPool, where: str, timeout: float) -> None:
        self._pool = pool
        self._where = where
        self._timeout = timeout
        self._replies: Replies | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Task[Replies] | None = None
        self._closed = False

    async def connected(self) -> Replies:
        """The connection, made first if there is none or it was lost. Commands sent on it
        with no ``await`` between them go out in that order.

        Lookups that find no connection share one attempt to make it, so a
        server that cannot be reached fails them all at once, not one after
        another.
        """
        replies = self._replies
        if replies is not None and not replies.lost:
            return replies
        if self._closed:
            raise RedisConnectionError(self._closed_message())
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
            self._connecting.add_done_callback(self._connected)
        return await asyncio.shield(self._connecting)

    async def execute(self, *command: Any) -> Any:
        """One command's reply."""
        return await (await self.connected()).send(*command)

    async def _connect(self) -> Replies:
        connection = self._pool.make_connection()  # type: ignore[no-untyped-call]
        await connection.connect()
        # redis-py keeps the stream it connected with on its connection object; the
        # stream is taken from it (so that the object, collected, closes nothing) and its
        # transport handed to this protocol. The stream is kept as long as the transport.
        writer = connection._writer
        connection._reader = connection._writer = None
        replies = Replies(self._where, self._timeout)
        replies.transport = writer.transport
        writer.transport.set_protocol(replies)
        if self._closed:  # closed while connecting
            replies.fail(RedisConnectionError, self._closed_message())
        self._replies, self._writer = replies, writer
        return replies

    def _closed_message(self) -> str:
        return f"the lookups' connection to {self._where} is closed"

    def _connected(self, task: asyncio.Task[Replies]) -> None:
        self._connecting = None
        if not task.cancelled():
            task.exception()  # retrieved: each lookup waiting on it raises it itself

    def close(self) -> None:
        """Fail the commands in flight with ``ConnectionError`` and drop the connection;
        later commands fail the same way."""
        self._closed = True
        if self._replies is not None:
            self._replies.fail(RedisConnectionError, self._closed_message())
        self._replies = self._writer = None


async def settled(futures: list[asyncio.Future[Any]]) -> list[Any]:
    """Each future's reply, or the exception it failed with, in order.

    Every future is awaited, so none is left failed with nobody to see it; a
    caller cancelled meanwhile gives up on the ones not answered yet.
    """
    out: list[Any] = []
    try:
        for future in futures:
            try:
                out.append(await future)
            except Exception as exc:  # the command's failure is its answer here
                out.append(exc)
    except BaseException:
        for future in futures:
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()
        raise
    return out
