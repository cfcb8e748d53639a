"""The newest version of each map's Delta table, shared by the calls of one process.

Opening a table replays its log (from its last checkpoint), so calls close
together share one snapshot: a table is opened again at most every
``REFRESH_SECONDS``, by one call while the others wait for it. A snapshot
also says which source offsets its version reflects
(``materializer.contract.table_marks``), which is how a table read waits for
``min_offsets`` (read-your-writes on the table, as ``freshness`` does for
the Redis copy).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from materializer.contract.table_marks import table_watermark
from materializer.contract.watermark import Watermark
from materializer.v1 import common_pb2 as common
from query_service.errors import DeadlineExceeded
from query_service.freshness import MARGIN_SECONDS, MAX_WAIT_SECONDS, check_positions, covers
from query_service.stores.delta import DeltaTables

REFRESH_SECONDS = 0.1
"""A snapshot younger than this is reused rather than the table opened again."""
SCHEMA_SECONDS = 5.0
"""How old a snapshot may be for its schema to type the entities Redis holds (``recent``):
a column added to the table reaches answers from Redis that much later."""
REMEMBERED_VERSIONS = 1024
"""Versions whose recorded watermark is kept, across all tables."""


@dataclass(frozen=True)
class TableSnapshot:
    """One version of a map's table and the source offsets it reflects."""

    map_name: str
    generation: int
    table: DeltaTable
    """A snapshot of ``version``; blocking to read (``asyncio.to_thread``)."""
    version: int
    watermark: Watermark | None
    """The source offsets every row of the version reflects (it may reflect more);
    ``None``: no commit within reach records any (a table written before they were)."""


@dataclass
class _Latest:
    snapshot: TableSnapshot
    opened_at: float
    """``time.monotonic()`` when the table was last opened to look for a newer version."""


class TableSnapshots:
    """Latest snapshots of the maps' tables, shared by one process's calls."""

    def __init__(self, tables: DeltaTables) -> None:
        self.tables = tables
        self._latest: dict[tuple[str, int], _Latest] = {}
        self._opening: dict[tuple[str, int], asyncio.Task[TableSnapshot]] = {}
        self._marks: OrderedDict[tuple[str, int], Watermark | None] = OrderedDict()
        """Recorded watermarks by (table id, version): a version's commits never change."""
        self._marks_lock = threading.Lock()

    async def latest(
        self,
        map_name: str,
        generation: int,
        wanted: Sequence[common.PartitionOffset] = (),
        time_remaining: float | None = None,
    ) -> TableSnapshot:
        """The newest version, once its watermark covers ``wanted``.

        Waits bounded by ``time_remaining`` (seconds; ``None``: at most
        ``freshness.MAX_WAIT_SECONDS``) and fails with ``DeadlineExceeded``
        a little before it, naming the offsets the table has not reached. A
        position in a topic the map does not read is ``InvalidArgument``; a
        map without a table yet is ``TableNotFound`` (without waiting: a
        table appears with the first batch, which a caller does not wait
        for). Versions arrive as the table's writer commits them, seconds
        behind the Redis copy.
        """
        if wanted:
            check_positions(map_name, self.tables.topics(map_name), wanted)
        snapshot = await self._fresh(map_name, generation)
        if covers(snapshot.watermark, wanted):
            return snapshot
        budget = MAX_WAIT_SECONDS if time_remaining is None else time_remaining - MARGIN_SECONDS
        try:
            async with asyncio.timeout(max(budget, 0.0)):
                while not covers(snapshot.watermark, wanted):
                    await asyncio.sleep(REFRESH_SECONDS)
                    snapshot = await self._fresh(map_name, generation)
        except TimeoutError:
            raise DeadlineExceeded(_not_reached(snapshot, wanted)) from None
        return snapshot

    async def recent(
        self, map_name: str, generation: int, max_age: float = SCHEMA_SECONDS
    ) -> TableSnapshot:
        """The cached snapshot if it was opened less than ``max_age`` seconds ago, else the
        newest: for a reader that needs the table's schema, not its rows."""
        cached = self._latest.get((map_name, generation))
        if cached is not None and time.monotonic() - cached.opened_at < max_age:
            return cached.snapshot
        return await self._fresh(map_name, generation)

    async def watermark_of(
        self, map_name: str, generation: int, table: DeltaTable
    ) -> Watermark | None:
        """The source offsets the snapshot ``table`` (any version) reflects; remembered per
        version, so paging through an older version reads its commits once."""
        latest = self._latest.get((map_name, generation))
        if latest is not None and latest.snapshot.table is table:
            return latest.snapshot.watermark
        return await asyncio.to_thread(self._recorded, table)

    def _recorded(self, table: DeltaTable) -> Watermark | None:
        """``table_watermark``, remembered (blocking)."""
        key = (str(table.metadata().id), table.version())
        with self._marks_lock:  # worker threads share it
            if key in self._marks:
                self._marks.move_to_end(key)
                return self._marks[key]
        watermark = table_watermark(table)
        with self._marks_lock:
            self._marks[key] = watermark
            while len(self._marks) > REMEMBERED_VERSIONS:
                self._marks.popitem(last=False)
        return watermark

    async def _fresh(self, map_name: str, generation: int) -> TableSnapshot:
        """The cached snapshot if it was opened less than ``REFRESH_SECONDS`` ago, else
        the table opened again (one opening per table at a time, shared by its waiters)."""
        key = (map_name, generation)
        cached = self._latest.get(key)
        if cached is not None and time.monotonic() - cached.opened_at < REFRESH_SECONDS:
            return cached.snapshot
        opening = self._opening.get(key)
        if opening is None:
            opening = asyncio.ensure_future(self._open(map_name, generation))
            self._opening[key] = opening
            opening.add_done_callback(lambda _: self._opening.pop(key, None))
        # Shielded: one caller's cancellation must not fail the others waiting on it.
        return await asyncio.shield(opening)

    async def _open(self, map_name: str, generation: int) -> TableSnapshot:
        key = (map_name, generation)
        started = time.monotonic()
        previous = self._latest.get(key)
        if previous is not None and await asyncio.to_thread(_unchanged, previous.snapshot.table):
            self._latest[key] = _Latest(previous.snapshot, started)
            return previous.snapshot
        table, watermark = await asyncio.to_thread(self._open_latest, map_name, generation)
        snapshot = TableSnapshot(map_name, generation, table, table.version(), watermark)
        previous = self._latest.get(key)
        if previous is not None and _same_version(previous.snapshot.table, table):
            snapshot = previous.snapshot  # keep the object callers may already be reading
        # One opening per table at a time: this one is the newest look at it.
        self._latest[key] = _Latest(snapshot, started)
        return snapshot

    def _open_latest(self, map_name: str, generation: int) -> tuple[DeltaTable, Watermark | None]:
        table = self.tables.open(map_name, None, generation)
        return table, self._recorded(table)


def _unchanged(table: DeltaTable) -> bool:
    """Whether the table's log has no version after the snapshot's: asking costs a listing
    of the log, a fraction of opening the table again (its log replayed, its newest
    commit read for its mark). A client without the call opens the table again."""
    latest = getattr(table._table, "get_latest_version", None)  # noqa: SLF001 - see above
    if latest is None:
        return False
    try:
        return bool(latest() == table.version())
    except (DeltaError, OSError):
        return False  # opening it again says what is wrong


def _same_version(a: DeltaTable, b: DeltaTable) -> bool:
    """The same version of the same table (a map deleted and created again starts over)."""
    return bool(a.version() == b.version() and a.metadata().id == b.metadata().id)


def _not_reached(snapshot: TableSnapshot, wanted: Sequence[common.PartitionOffset]) -> str:
    have = snapshot.watermark.offsets if snapshot.watermark else {}
    missing = ", ".join(
        f"{w.topic}[{w.partition}] >= {w.offset} (at {have.get(w.topic, {}).get(w.partition, 0)})"
        for w in wanted
        if have.get(w.topic, {}).get(w.partition, 0) < w.offset
    )
    recorded = "" if snapshot.watermark else "; its versions record no offsets yet"
    return (
        f"the Delta table of map {snapshot.map_name!r} did not reach the requested offsets "
        f"before the deadline: {missing} (version {snapshot.version}{recorded})"
    )
