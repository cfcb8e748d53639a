"""A statement one of its map's indexes narrows (``statement.Selection``), answered from the
map's Redis copy: as fresh as a ``Get``, without a scan of the table.

The index names the candidates (``indexes.plan``, with the statement's parameters
bound); their entities, typed as the table types its rows (its newest schema), are
the table the statement then runs over, in the engine every statement runs in, with
the same settings (``sql.engine``). The statement's ``WHERE`` keeps exactly the rows
it would keep from the table, and whatever else it computes (a projection, an
aggregate, an order, a limit) it computes from those rows: so the answer is the
table's answer for the entities Redis holds. It reads the Redis watermark, taken
before the entries, and no table version; ``min_offsets`` waits on the Redis copy.

What cannot be answered so goes to the statement processes, before anything is
sent: no index serves the condition, the statement names a column of the table's own
(``_updated_at``), a column's type JSON does not carry as the table has it, an index
changed under the read, more than ``MAX_CANDIDATES`` candidates (an index on a common
value is no narrower than the table), or an error of the engine (the table's answer
then says it as the table's would).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from datafusion import RuntimeEnvBuilder, SessionContext

from materializer.catalog.live import LiveMaps
from materializer.contract.index_entries import key_of
from materializer.contract.redis_layout import physical_name
from materializer.contract.table_layout import TABLE_KEY, table_meta
from materializer.contract.watermark import Watermark
from materializer.v1 import common_pb2 as common
from query_service.freshness import FreshnessGate
from query_service.indexes.plan import IndexScan, index_scan
from query_service.indexes.reads import Entry, IndexReads, IndexUnread
from query_service.sql import engine
from query_service.sql.arrow_types import cast, portable
from query_service.sql.statement import Statement
from query_service.stores.base import MapStore
from query_service.tables.entity_rows import entity_schema, readable, typed_rows
from query_service.tables.snapshots import TableSnapshots

MAX_CANDIDATES = 50_000
"""Entries read at most for one statement; past them the table answers."""
ROUND = 10_000
"""Entries read per call of the masters."""
RUNNING = 2
"""Statements over candidates run in the service at once; past them, the statement
processes answer (with their deadlines, queue and memory bounds)."""
MEMORY_BYTES = 256 * 2**20
"""The engine's pool for one statement over candidates (they are at most
``MAX_CANDIDATES`` entities)."""


@dataclass(frozen=True)
class IndexedAnswer:
    """A statement's whole answer through an index."""

    table: pa.Table
    """In the plain types every answer has (``arrow_types.portable``)."""
    index: str
    """The field whose index was read."""
    watermark: Watermark | None
    """The map's Redis watermark, read before the entries."""


class IndexedSelects:
    """Statements answered through the maps' indexes, for one query-service process."""

    def __init__(
        self,
        live: LiveMaps,
        store: MapStore,
        gate: FreshnessGate,
        snapshots: TableSnapshots,
        reads: IndexReads,
    ) -> None:
        self._live = live
        self._store = store
        self._gate = gate
        self._snapshots = snapshots
        self._reads = reads
        self._running = asyncio.Semaphore(RUNNING)

    async def answer(
        self,
        statement: Statement,
        params: Sequence[object],
        min_offsets: Sequence[common.PartitionOffset],
        time_remaining: float | None,
        rows: int,
    ) -> IndexedAnswer | None:
        """The statement's answer, at most ``rows`` rows, through an index; ``None`` when the
        table must answer (see the module docstring)."""
        selection = statement.selection
        if selection is None or not self._live.config.maps[selection.map_name].indexes:
            return None
        name = selection.map_name
        generation = await self._store.generation(name)
        physical = physical_name(name, generation)
        ready = await self._reads.ready(physical)
        if not ready:
            return None
        snapshot = await self._snapshots.recent(name, generation)
        schema = pa.schema(snapshot.table.schema().to_arrow())
        own = set(table_meta(self._live.config.map(name))) - {TABLE_KEY}
        if own & (selection.columns | (set(schema.names) if selection.star else set())):
            return None
        reading = entity_schema(schema, own)
        if not all(readable(f.type) for f in reading):
            return None
        types = {f.name: f.type for f in reading}
        scan = index_scan(selection.where, ready, types, params)
        if scan is None:
            return None
        await self._gate.wait(name, min_offsets, time_remaining)
        watermark = await self._store.watermark(name)
        try:
            entries = await self._candidates(physical, scan)
        except IndexUnread:
            return None
        if entries is None or self._running.locked():
            return None  # too many candidates, or enough statements here: the table's
        async with self._running:
            table = await asyncio.to_thread(
                _run, statement.text, params, name, reading, entries, rows
            )
        return None if table is None else IndexedAnswer(table, scan.field, watermark)

    async def _candidates(self, physical: str, scan: IndexScan) -> list[Entry] | None:
        """Every entry the scan names, with its entity; ``None`` past ``MAX_CANDIDATES``."""
        entries: list[Entry] = []
        after = None
        while True:
            read = await self._reads.entries(physical, scan, after, ROUND)
            entries += read
            if len(entries) > MAX_CANDIDATES:
                return None
            if len(read) < ROUND:
                return entries
            after = read[-1][0]


def _run(
    text: str,
    params: Sequence[object],
    name: str,
    reading: pa.Schema,
    entries: list[Entry],
    rows: int,
) -> pa.Table | None:
    """The statement over the entries' entities as the map's table, at most ``rows`` rows
    (blocking: DataFusion); ``None`` when an entity does not read as a row of the table
    (a double written as "NaN", say), or on an error of the engine, which the table's
    run then reports. An entity read twice (its value moved past the read between two
    rounds) counts once, as its newest read: the table has one row per key."""
    present = {key_of(entry): entity for entry, entity in entries if entity is not None}
    batch = typed_rows(reading, list(present), list(present.values()))
    if batch is None:
        return None
    runtime = RuntimeEnvBuilder().with_greedy_memory_pool(MEMORY_BYTES).with_disk_manager_disabled()
    context = SessionContext(engine.session_config(1), runtime)
    context.register_record_batches(name, [[batch]])
    try:
        frame = context.sql_with_options(
            text, engine.read_only(), param_values=engine.parameters(list(params))
        ).limit(rows)
        found = frame.to_arrow_table()
    except Exception:  # noqa: BLE001 - the engine's own error comes from the table's run
        return None
    schema = portable(found.schema)
    return pa.Table.from_batches([cast(b, schema) for b in found.to_batches()], schema)
