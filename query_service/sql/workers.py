"""The statement processes of one query service: started at the first statement, reused.

A statement borrows a process for as long as its answer is being read, so at most
``query.sql.workers`` statements run at once; up to ``query.sql.max_queued`` more
wait their turn within their deadline, and beyond that a statement is refused at
once (RESOURCE_EXHAUSTED), so a burst cannot pile up work the service will never
finish. A statement whose deadline passes, or whose caller goes away, ends its
process (the only way to stop the engine mid-statement); a fresh one replaces it
at the next statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import sys
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from materializer.config import SqlConfig
from query_service.errors import (
    DeadlineExceeded,
    InvalidArgument,
    ResourceExhausted,
    StoreUnavailable,
)
from query_service.sql import frames

log = logging.getLogger(__name__)

START_SECONDS = 60.0
"""How long a new process may take to import the engine before it counts as failed."""


@dataclass(eq=False)
class _Process:
    process: asyncio.subprocess.Process

    @property
    def reader(self) -> asyncio.StreamReader:
        assert self.process.stdout is not None
        return self.process.stdout

    @property
    def writer(self) -> asyncio.StreamWriter:
        assert self.process.stdin is not None
        return self.process.stdin


class Workers:
    """A bounded set of statement processes (see the module docstring)."""

    def __init__(self, config: SqlConfig) -> None:
        self._config = config
        self._slots = asyncio.Semaphore(config.workers)
        self._idle: list[_Process] = []
        self._busy: set[_Process] = set()
        self._waiting = 0
        self._closed = False

    @property
    def running(self) -> int:
        """Statements running now."""
        return len(self._busy)

    async def run(
        self, request: dict[str, Any], deadline: float, late: str
    ) -> AsyncGenerator[tuple[bytes, bytes]]:
        """The frames answering ``request``: ``SCHEMA``, ``BATCH``… and nothing after.

        ``deadline`` is on the event loop's clock; past it the statement is stopped
        and ``DeadlineExceeded(late)`` raised. Engine errors are raised as the
        service's errors. Leaving the iteration early stops the statement.
        """
        worker = await self._borrow(deadline, late)
        finished = False
        try:
            async with asyncio.timeout_at(deadline):
                worker.writer.write(frames.encode(frames.REQUEST, pickle.dumps(request)))
                await worker.writer.drain()
                while True:
                    kind, payload = await frames.read_async(worker.reader)
                    if kind == frames.DONE:
                        finished = True
                        return
                    if kind == frames.ERROR:
                        finished = True
                        raise _error(*frames.parse_error(payload))
                    yield kind, payload
        except TimeoutError:
            raise DeadlineExceeded(late) from None
        except (asyncio.IncompleteReadError, ConnectionError):
            raise StoreUnavailable(
                f"the statement's process ended while running it (exit status "
                f"{worker.process.returncode}); the service goes on with a new one"
            ) from None
        finally:
            self._busy.discard(worker)
            # The slot is freed whatever happens while the process is reaped: a second
            # cancellation (the caller's, as gRPC ends a call past its deadline) may
            # interrupt that wait, and a slot kept would stall every later statement.
            try:
                if finished and not self._closed:
                    self._idle.append(worker)
                else:
                    await _stop(worker)
            finally:
                self._slots.release()

    async def _borrow(self, deadline: float, late: str) -> _Process:
        """A process for one statement, waiting for a free one within the deadline."""
        if self._closed:
            raise StoreUnavailable("the query service is stopping")
        if self._slots.locked():
            if self._waiting >= self._config.max_queued:
                raise ResourceExhausted(
                    f"sql: {self._config.workers} statements running and "
                    f"{self._waiting} waiting, the most this process takes "
                    "(query.sql.workers, query.sql.max_queued); try again shortly"
                )
            self._waiting += 1
            try:
                async with asyncio.timeout_at(deadline):
                    await self._slots.acquire()
            except TimeoutError:
                raise DeadlineExceeded(
                    f"{late}: it waited for a free statement process "
                    f"({self._config.workers} at once, query.sql.workers)"
                ) from None
            finally:
                self._waiting -= 1
        else:
            await self._slots.acquire()
        try:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.returncode is None:
                    self._busy.add(worker)
                    return worker
            worker = await self._start()
        except BaseException:
            self._slots.release()
            raise
        self._busy.add(worker)
        return worker

    async def _start(self) -> _Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "query_service.sql.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = _Process(process)
        try:
            async with asyncio.timeout(START_SECONDS):
                kind, _ = await frames.read_async(worker.reader)
        except (TimeoutError, asyncio.IncompleteReadError):
            await _stop(worker)
            raise StoreUnavailable(
                "sql: a statement process did not start (see the service's log)"
            ) from None
        if kind != frames.READY:
            await _stop(worker)
            raise StoreUnavailable(f"sql: a statement process started wrongly ({kind!r})")
        log.debug("statement process %d started", process.pid)
        return worker

    async def close(self) -> None:
        """End every process; running statements end with them."""
        self._closed = True
        for worker in [*self._idle, *self._busy]:
            await _stop(worker)
        self._idle.clear()


async def _stop(worker: _Process) -> None:
    """End a process at once and reap it: its statement, if any, is abandoned."""
    if worker.process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            worker.process.kill()
    with contextlib.suppress(Exception):
        worker.writer.close()
    await worker.process.wait()


def _error(kind: str, message: str) -> Exception:
    if kind == frames.MEMORY:
        return ResourceExhausted(
            f"the statement needs more memory than it may use (query.sql.memory_bytes): {message}"
        )
    if kind == frames.STORAGE:
        return StoreUnavailable(f"cannot read a table: {message}")
    return InvalidArgument(f"sql: {message}")
