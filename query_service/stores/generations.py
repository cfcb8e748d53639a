"""Which generation of each map's data readers use, kept in memory and refreshed often.

A rebuild writes a new copy of a map under ``<map>~<n>`` and then points
``<map>:__generation__`` at it (``materializer.contract.redis_layout``). Reading the pointer
on every lookup would add a round trip to each one, so each process keeps it
for ``REFRESH_SECONDS``: after a switch, a process goes on reading the old
copy for at most that long, and the rebuild keeps the old copy in place for a
grace period far longer than that, so no lookup finds a key missing.
"""

from __future__ import annotations

import asyncio
import functools
import time

from materializer.clients.redis import AsyncClient
from materializer.contract.redis_layout import generation_key, parse_generation, physical_name

REFRESH_SECONDS = 0.5


class Generations:
    """Map name to generation, one ``GET`` per map per refresh, concurrent askers sharing it."""

    def __init__(self, client: AsyncClient, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self._client = client
        self._refresh = refresh_seconds
        self._known: dict[str, tuple[int, float]] = {}
        self._pending: dict[str, asyncio.Task[int]] = {}

    def known(self, map_name: str) -> int | None:
        """The map's generation if read within the refresh interval: a lookup's fast path,
        which costs no coroutine."""
        known = self._known.get(map_name)
        if known is not None and time.monotonic() - known[1] < self._refresh:
            return known[0]
        return None

    async def generation(self, map_name: str) -> int:
        """The map's current generation; store errors propagate (the caller maps them)."""
        known = self.known(map_name)
        if known is not None:
            return known
        pending = self._pending.get(map_name)
        if pending is None:
            # One read for every asker, as a task of its own: an asker cancelled meanwhile
            # (its client gave up) cancels neither the read nor the others' wait for it.
            pending = asyncio.get_running_loop().create_task(self._read(map_name))
            self._pending[map_name] = pending
            pending.add_done_callback(functools.partial(self._done, map_name))
        return await asyncio.shield(pending)

    def _done(self, map_name: str, read: asyncio.Task[int]) -> None:
        self._pending.pop(map_name, None)
        if not read.cancelled():
            read.exception()  # retrieved: each asker raises it itself, if any is left

    async def _read(self, map_name: str) -> int:
        generation = parse_generation(await self._client.get(generation_key(map_name)))
        self._known[map_name] = (generation, time.monotonic())
        return generation

    async def physical(self, map_name: str) -> str:
        """Where the map's current data lives (``redis_layout.physical_name``)."""
        return physical_name(map_name, await self.generation(map_name))
