"""Lookups answered from a map's Delta table while the run restores the map's Redis copy,
as Hazelcast's MapLoader answers a miss from the durable store.

A Redis that lost a map (a server restarted empty) leaves lookups of the keys not yet
written back UNAVAILABLE; the table holds every key the whole time, at a known version
and watermark. A point read of the table costs a scan (its files hold keys in no order
their statistics could prune by: tens of milliseconds on a million rows), so the first
lookup of a restore reads the newest version's keys and entities once into memory,
about a second per million rows, which the lookups of the moment share; each lookup
then costs a dictionary read. The copy is dropped ``IDLE_SECONDS`` after its last use:
once the map is whole again, Redis answers and nothing uses it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from materializer.catalog.live import LiveMaps
from materializer.contract.entity_json import encode_rows
from materializer.contract.table_layout import TABLE_KEY, TABLE_UPDATED_AT, table_meta
from materializer.contract.watermark import Watermark
from query_service.tables.snapshots import TableSnapshots

IDLE_SECONDS = 30.0
"""How long a map's copy of its table is kept after its last lookup."""


@dataclass(frozen=True)
class TableLookup:
    """Entities read from a map's table: one per key asked (``None``: not in the table)."""

    entities: list[bytes | None]
    version: int
    watermark: Watermark | None


class _Copy:
    """One version of a map's table in memory, its rows found by key."""

    def __init__(
        self,
        version: int,
        watermark: Watermark | None,
        rows: pa.Table,
        expires_us: list[int] | None,
    ) -> None:
        self.version = version
        self.watermark = watermark
        self.rows = rows
        keys = rows.column(TABLE_KEY).to_pylist()
        self.places = dict(zip(keys, range(len(keys)), strict=True))
        self.expires_us = expires_us
        """Per row, when Redis expires it (``ttl.redis`` after ``_updated_at``); ``None``:
        the table cannot tell, and the restore writes every row back."""
        self.used = time.monotonic()

    def entities(self, keys: Sequence[str]) -> list[bytes | None]:
        places = [self.places.get(key) for key in keys]
        if self.expires_us is not None:  # gone from Redis by its TTL: not in the map
            now_us = time.time_ns() // 1000
            ends = self.expires_us
            places = [p if p is not None and ends[p] > now_us else None for p in places]
        found = [p for p in places if p is not None]
        if not found:
            return [None] * len(keys)
        encoded = iter(encode_rows(self.rows.take(found), TABLE_KEY))
        return [None if p is None else next(encoded)[1] for p in places]


class TableFallback:
    """The maps' tables read into memory for lookups during a restore, one copy per map."""

    def __init__(self, snapshots: TableSnapshots, live: LiveMaps) -> None:
        self._snapshots = snapshots
        self._live = live
        self._copies: dict[tuple[str, int], asyncio.Task[_Copy]] = {}
        self._sweeper: asyncio.TimerHandle | None = None

    async def get_many(self, map_name: str, generation: int, keys: Sequence[str]) -> TableLookup:
        """The keys' entities as the table's copy holds them (read once per restore)."""
        at = (map_name, generation)
        loading = self._copies.get(at)
        if loading is None or _failed(loading):
            loading = self._copies[at] = asyncio.ensure_future(self._load(map_name, generation))
            self._sweep_later()
        copy = await asyncio.shield(loading)
        copy.used = time.monotonic()
        return TableLookup(copy.entities(keys), copy.version, copy.watermark)

    async def _load(self, map_name: str, generation: int) -> _Copy:
        snapshot = await self._snapshots.latest(map_name, generation)
        config = self._live.config.map(map_name)
        own = [c for c in table_meta(config) if c != TABLE_KEY]
        ttl = config.ttl.redis if config.ttl is not None else None

        def read() -> _Copy:
            table = snapshot.table.to_pyarrow_table()
            expires_us = None
            if ttl is not None and TABLE_UPDATED_AT in table.column_names:
                written = pc.cast(table.column(TABLE_UPDATED_AT), pa.timestamp("us"))
                lifetime_us = int(ttl.total_seconds() * 1_000_000)
                expires_us = [
                    -1 if at is None else at + lifetime_us
                    for at in pc.cast(written, pa.int64()).to_pylist()
                ]
            rows = table.drop_columns([c for c in own if c in table.column_names])
            return _Copy(snapshot.version, snapshot.watermark, rows, expires_us)

        return await asyncio.to_thread(read)

    def _sweep_later(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(IDLE_SECONDS, self._sweep)

    def _sweep(self) -> None:
        """Drop the copies unused for ``IDLE_SECONDS``; look again later while any is kept."""
        self._sweeper = None
        now = time.monotonic()
        for at, loading in list(self._copies.items()):
            if not loading.done():
                continue
            if _failed(loading) or now - loading.result().used > IDLE_SECONDS:
                del self._copies[at]
        if self._copies:
            self._sweep_later()


def _failed(loading: asyncio.Task[_Copy]) -> bool:
    """Whether a load ended without a copy (the next lookup loads again)."""
    return loading.done() and (loading.cancelled() or loading.exception() is not None)
