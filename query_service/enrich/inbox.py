"""A stream's requests read ahead of their processing and handed over in batches.

While one batch waits on the store, the next requests keep arriving; taking
all of them at once is what lets one round trip serve many requests. The
read-ahead is bounded by weight (events), not by count, so a client sending
large requests cannot make the server hold more than about ``limit`` events.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    """One reader task puts items in, one consumer takes them out; single event loop."""

    def __init__(self, weight: Callable[[T], int], limit: int) -> None:
        self._weight = weight
        self._limit = limit
        self._items: deque[T] = deque()
        self._pending = 0
        self._closed = False
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self._room = asyncio.Event()

    def read_from(self, source: AsyncIterable[T], name: str) -> asyncio.Task[None]:
        """Start a task putting ``source``'s items in; its end, error or cancellation closes
        the inbox. The caller cancels the task when it stops taking (its own end, an error,
        the client's cancellation), so no read outlives the call."""
        task = asyncio.create_task(self._fill(source), name=name)
        task.add_done_callback(lambda t: self._close(None if t.cancelled() else t.exception()))
        return task

    async def _fill(self, source: AsyncIterable[T]) -> None:
        async for item in source:
            while self._pending >= self._limit:
                self._room.clear()
                await self._room.wait()
            self._items.append(item)
            self._pending += self._weight(item)
            self._ready.set()

    def _close(self, error: BaseException | None) -> None:
        self._closed = True
        self._error = error
        self._ready.set()

    async def take(self) -> list[T]:
        """Every waiting item up to ``limit`` weight (at least one), in order.

        Waits while none is waiting; ``[]`` once the source has ended and all was
        taken; the source's error once all read before it was taken.
        """
        while not self._items and not self._closed:
            self._ready.clear()
            await self._ready.wait()
        if not self._items:
            if self._error is not None:
                raise self._error
            return []
        batch = [self._items.popleft()]
        total = self._weight(batch[0])
        while self._items and total + self._weight(self._items[0]) <= self._limit:
            item = self._items.popleft()
            batch.append(item)
            total += self._weight(item)
        self._pending -= total
        self._room.set()
        return batch
