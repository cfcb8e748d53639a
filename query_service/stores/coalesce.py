"""Concurrent single-key lookups of one map on a Redis Cluster, answered by one read.

A read through redis-py's cluster client costs a lookup far more in Python
than Redis takes to answer it, so lookups that arrive in the same turn of the
event loop are gathered and read together: one ``HGETALL`` for the watermark,
then one read per master for the keys (``cluster_reads``). Each caller gets
its entity and the watermark read just before it, the same lower bound a
lookup of its own would give. With one call in flight it costs one read, as
before. On one server each lookup goes down the pipelined connection instead
(``lookup_connection``), which costs less than gathering: gRPC hands its calls
to the loop one per turn, so a gathering there held hardly more than one call
(docs/decisions/0010-lookups-down-one-pipelined-connection.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from query_service.stores.base import BatchLookup, Lookup

ReadMany = Callable[[str, Sequence[str]], Awaitable[BatchLookup]]
MAX_KEYS = 1000
"""Keys gathered into one read at most; more wait for the next one."""


class Coalescer:
    """Gathers ``get`` calls per map and reads each gathering with one ``read_many``."""

    def __init__(self, read_many: ReadMany) -> None:
        self._read_many = read_many
        self._pending: dict[str, list[tuple[str, asyncio.Future[Lookup]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def get(self, map_name: str, key: str) -> Lookup:
        """The entity under ``key`` and the map's watermark, read with other lookups."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Lookup] = loop.create_future()
        waiting = self._pending.setdefault(map_name, [])
        waiting.append((key, future))
        if len(waiting) == 1:
            # After the callbacks ready now: the other calls of this turn join in.
            loop.call_soon(self._flush, map_name)
        elif len(waiting) >= MAX_KEYS:
            self._flush(map_name)
        return await future

    def _flush(self, map_name: str) -> None:
        waiting = self._pending.pop(map_name, None)
        if waiting:
            task = asyncio.create_task(self._read(map_name, waiting))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read(self, map_name: str, waiting: list[tuple[str, asyncio.Future[Lookup]]]) -> None:
        try:
            batch = await self._read_many(map_name, [key for key, _ in waiting])
        except Exception as exc:  # every caller of the gathering gets the store's error
            for _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), entity in zip(waiting, batch.entities, strict=True):
            if not future.done():  # a caller that was cancelled meanwhile
                future.set_result(Lookup(entity=entity, watermark=batch.watermark))
