"""A SQL statement from any front (gRPC, HTTP, Arrow Flight SQL, the console) run to its
answer: checked, its tables' versions fixed, then run in a statement process.

Every answer says, per table read, the version read and the source offsets that
version reflects; with ``min_offsets`` it first waits, within the deadline, until
the tables read reflect them. Every statement is bounded: its rows
(``query.sql.max_rows``, or the request's ``limit``), its time (the caller's
deadline and ``query.sql.timeout``), its memory (``query.sql.memory_bytes``, the
engine's pool) and how many run at once (``query.sql.workers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

import pyarrow as pa

from materializer.catalog.live import LiveMaps
from materializer.clients.object_store import delta_rs_location
from materializer.contract.redis_layout import physical_name
from materializer.contract.table_layout import table_meta, table_path
from materializer.contract.watermark import Watermark
from materializer.v1 import common_pb2 as common
from query_service.errors import InvalidArgument, MapNotFound, ResourceExhausted
from query_service.freshness import FreshnessGate
from query_service.indexes.reads import IndexReads
from query_service.sql import frames
from query_service.sql.indexed import IndexedSelects
from query_service.sql.key_lookup import answer_schema, lookup_key, row
from query_service.sql.statement import KeyLookup, Statement, check
from query_service.sql.workers import Workers
from query_service.stores.base import MapStore
from query_service.tables.snapshots import TableSnapshot, TableSnapshots

MARGIN_SECONDS = 0.05
"""A statement is stopped this much before the caller's deadline, so the caller reads
our message rather than its own timeout."""
TARGET_PARTITIONS = 2
"""The engine's parallelism per statement: two partitions keep a core busy each while
the service and the other statement share the rest."""
Param = None | bool | int | float | str | bytes | Decimal | datetime | date


@dataclass(frozen=True)
class TableRead:
    """One table an answer read: the version, and the source offsets it reflects."""

    map_name: str
    version: int
    """The Delta table version read; -1 when the answer came from Redis."""
    watermark: Watermark | None
    redis: bool = False
    """Answered from the map's Redis copy: a plain key lookup (``key_lookup``), or a
    statement one of the map's indexes narrows (``indexed``)."""
    index: str = ""
    """The field whose index was read, when one was."""


class Answer:
    """A statement's answer: its schema, then its record batches as they come, each with
    its Arrow IPC message (what the binary fronts send as it is).

    Iterate ``batches`` once, to the end or inside ``contextlib.aclosing``: leaving
    early stops the statement. ``tables`` is known before the first batch.
    """

    def __init__(
        self,
        schema: pa.Schema,
        schema_message: bytes,
        frames_in: AsyncGenerator[tuple[bytes, bytes]],
        tables: list[TableRead],
        max_rows: int,
        limit: int,
    ) -> None:
        self.schema = schema
        self.schema_message = schema_message
        self.tables = tables
        self.rows = 0
        self._frames = frames_in
        self._max_rows = max_rows
        self._limit = limit

    async def batches(self) -> AsyncIterator[tuple[pa.RecordBatch, bytes]]:
        """The record batches; ``ResourceExhausted`` once more than ``max_rows`` came."""
        async with contextlib.aclosing(self._frames) as incoming:
            async for _, payload in incoming:
                batch = pa.ipc.read_record_batch(pa.py_buffer(payload), self.schema)
                if self._limit == 0 and self.rows + batch.num_rows > self._max_rows:
                    raise ResourceExhausted(
                        f"sql: the answer has more than {self._max_rows} rows "
                        "(query.sql.max_rows); add a LIMIT or a narrower WHERE, or ask "
                        "for fewer rows with limit"
                    )
                self.rows += batch.num_rows
                yield batch, payload

    async def table(self) -> pa.Table:
        """The whole answer in memory."""
        return pa.Table.from_batches([batch async for batch, _ in self.batches()], self.schema)

    async def close(self) -> None:
        """Stop the statement if its answer was not read to the end."""
        await self._frames.aclose()


class SqlExecutor:
    """Runs statements over the maps' Delta tables for one query-service process."""

    def __init__(
        self,
        live: LiveMaps,
        snapshots: TableSnapshots,
        generation: Callable[[str], Awaitable[int]],
        *,
        store: MapStore | None = None,
        gate: FreshnessGate | None = None,
        indexes: IndexReads | None = None,
    ) -> None:
        """``store`` and ``gate``: plain key lookups are answered from Redis with them, and
        with ``indexes`` statements an index narrows too; without, every statement goes to
        the engine."""
        self._live = live
        self._snapshots = snapshots
        self._generation = generation
        self._store = store
        self._gate = gate
        self._indexed = (
            IndexedSelects(live, store, gate, snapshots, indexes)
            if store is not None and gate is not None and indexes is not None
            else None
        )
        self._workers = Workers(live.config.query.sql)
        self._schemas: dict[tuple[str, tuple[str, ...] | None, int, int], pa.Schema | None] = {}

    @property
    def running(self) -> int:
        """Statements running now."""
        return self._workers.running

    def statement(self, text: str) -> Statement:
        """The checked statement (``statement.check``), its maps known to this service."""
        statement = check(text)
        maps = self._live.config.maps
        for name in statement.maps:
            if name not in maps:
                raise MapNotFound(name, maps)
        return statement

    async def execute(
        self,
        text: str,
        params: Sequence[Param] = (),
        *,
        min_offsets: Sequence[common.PartitionOffset] = (),
        limit: int = 0,
        time_remaining: float | None = None,
    ) -> Answer:
        """Check, wait for ``min_offsets``, and start the statement: its answer, whose
        batches are read from the statement process as the caller takes them."""
        config = self._live.config.query.sql
        loop = asyncio.get_running_loop()
        called = loop.time()
        statement = self.statement(text)
        _check_params(statement, params)
        if limit < 0 or limit > config.max_rows:
            raise InvalidArgument(
                f"limit: {limit}, must be 0 (up to query.sql.max_rows, {config.max_rows}) "
                f"to {config.max_rows}"
            )
        if statement.key_lookup is not None:
            answer = await self._from_redis(
                statement.key_lookup, params, min_offsets, time_remaining
            )
            if answer is not None:
                return answer
        if statement.selection is not None and self._indexed is not None:
            rows = limit or config.max_rows + 1
            found = await self._indexed.answer(statement, params, min_offsets, time_remaining, rows)
            if found is not None:
                read = TableRead(
                    statement.selection.map_name, -1, found.watermark, redis=True, index=found.index
                )
                schema = found.table.schema
                message = schema.serialize().to_pybytes()
                batches = _all(found.table.to_batches())
                return Answer(schema, message, batches, [read], config.max_rows, limit)
        if time_remaining is not None:  # what a try through Redis spent is the caller's
            time_remaining -= loop.time() - called
        server_max = config.timeout.total_seconds()
        if time_remaining is not None and time_remaining - MARGIN_SECONDS < server_max:
            deadline = loop.time() + max(time_remaining - MARGIN_SECONDS, 0.0)
            late = "the statement did not finish before the call's deadline; it was stopped"
        else:
            deadline = loop.time() + server_max
            late = (
                f"the statement ran longer than {server_max:g} s (query.sql.timeout); "
                "it was stopped"
            )
        snapshots = await self._read_versions(statement, min_offsets, deadline - loop.time())
        request = {
            "sql": statement.text,
            "params": list(params),
            "tables": [self._table(s) for s in snapshots],
            "rows": limit or config.max_rows + 1,
            "memory_bytes": config.memory_bytes,
            "partitions": TARGET_PARTITIONS,
        }
        incoming = self._workers.run(request, deadline, late)
        try:
            kind, payload = await anext(incoming)
        except BaseException:
            await incoming.aclose()
            raise
        if kind != frames.SCHEMA:
            await incoming.aclose()
            raise RuntimeError(f"a statement process answered {kind!r} before its schema")
        schema = pa.ipc.read_schema(pa.py_buffer(payload))
        tables = [TableRead(s.map_name, s.version, s.watermark) for s in snapshots]
        return Answer(schema, payload, incoming, tables, config.max_rows, limit)

    async def _read_versions(
        self,
        statement: Statement,
        min_offsets: Sequence[common.PartitionOffset],
        budget: float,
    ) -> list[TableSnapshot]:
        """Each table's newest version, once those reading a topic of ``min_offsets``
        reflect the offsets given for it."""
        topics = self._live.topics()
        read = {topic for name in statement.maps for topic in topics.get(name, ())}
        for i, wanted in enumerate(min_offsets):
            if wanted.topic not in read:
                raise InvalidArgument(
                    f"min_offsets[{i}].topic: no table the statement reads follows "
                    f"{wanted.topic!r} (they follow {', '.join(sorted(read)) or 'nothing'})"
                )
        snapshots = []
        for name in statement.maps:
            mine = [w for w in min_offsets if w.topic in topics.get(name, ())]
            generation = await self._generation(name)
            snapshots.append(await self._snapshots.latest(name, generation, mine, budget))
        return snapshots

    async def _from_redis(
        self,
        lookup: KeyLookup,
        params: Sequence[Param],
        min_offsets: Sequence[common.PartitionOffset],
        time_remaining: float | None,
    ) -> Answer | None:
        """A plain key lookup's answer from Redis (``key_lookup``); ``None``: the engine's."""
        key = lookup_key(lookup, params)
        if self._store is None or self._gate is None or key is None:
            return None
        name = lookup.map_name
        generation = await self._generation(name)
        snapshot = await self._snapshots.latest(name, generation)
        cached = (name, lookup.columns, generation, snapshot.version)
        if cached not in self._schemas:
            if len(self._schemas) > 256:
                self._schemas.clear()
            table_schema = pa.schema(snapshot.table.schema().to_arrow())
            meta = table_meta(self._live.config.map(name))
            self._schemas[cached] = answer_schema(lookup, table_schema, meta)
        schema = self._schemas[cached]
        if schema is None:
            return None
        await self._gate.wait(name, min_offsets, time_remaining)
        found = await self._store.get_with_watermark(name, key)
        batch = row(schema, key, found.entity)
        if batch is None:
            return None
        read = [TableRead(name, -1, found.watermark, redis=True)]
        max_rows = self._live.config.query.sql.max_rows
        return Answer(schema, schema.serialize().to_pybytes(), _all([batch]), read, max_rows, 0)

    def _table(self, snapshot: TableSnapshot) -> tuple[str, str, dict[str, str] | None, int]:
        config = self._live.config
        path = table_path(config, physical_name(snapshot.map_name, snapshot.generation))
        uri, options = delta_rs_location(config, path)
        return snapshot.map_name, uri, options, snapshot.version

    async def close(self) -> None:
        """End the statement processes."""
        await self._workers.close()


async def _all(batches: Sequence[pa.RecordBatch]) -> AsyncGenerator[tuple[bytes, bytes]]:
    """An answer held whole, as the frames a statement process sends."""
    for batch in batches:
        if batch.num_rows:
            yield frames.BATCH, batch.serialize().to_pybytes()


def _check_params(statement: Statement, params: Sequence[Param]) -> None:
    if len(params) != statement.parameters:
        uses = f"$1…${statement.parameters}" if statement.parameters else "no parameters"
        raise InvalidArgument(f"params: {len(params)} given; the statement uses {uses}")
    for i, value in enumerate(params):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgument(f"params[{i}]: {value} is not a finite number")
