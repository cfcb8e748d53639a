"""``Query`` answered from the map's Redis copy through one of its indexes, when its filter
lets one narrow the keys (``plan.index_scan``): as fresh as a ``Get``, without a scan of
the table.

The index names candidates; the whole filter then decides, applied by DataFusion to
the candidates' entities typed as the table types its rows (the table's newest
schema), so a row is kept exactly when the engine would keep it from the table. Rows
come in the index's order (the field's value, then the key), a page at a time; the
page token holds the last entry read, so the next page reads on after it: an entity
that keeps its value is sent once, whatever is written meanwhile. The answer carries
the Redis watermark read before each round of entities, which ``min_offsets`` waits on
as ``Get`` does.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pyarrow as pa
from deltalake import DeltaTable

from materializer.catalog.live import LiveMaps
from materializer.contract.entity_json import encode_rows
from materializer.contract.index_entries import key_of
from materializer.contract.redis_layout import physical_name
from materializer.contract.table_layout import TABLE_KEY
from materializer.v1 import map_service_pb2 as pb
from query_service.errors import InvalidArgument, StoreUnavailable
from query_service.filters import render_filter, sql
from query_service.freshness import FreshnessGate, watermark_to_proto
from query_service.indexes.plan import IndexScan, index_scan
from query_service.indexes.reads import Entry, IndexReads, IndexUnread
from query_service.stores.delta import TABLE
from query_service.stores.redis import RedisMapStore
from query_service.tables import query_plan
from query_service.tables.entity_rows import entity_schema, filtered, typed_rows
from query_service.tables.page_token import PageToken, fingerprint
from query_service.tables.snapshots import TableSnapshots

ORDINAL = "__materializer_entry"
"""A column of the candidates' own: their place in the index's order."""
PLANS = 256
"""Query plans kept, over all maps."""
MIN_ROUND = 100
MAX_ROUND = 10_000
"""Candidates read per round: twice the rows a page still needs, within these."""


class IndexQueries:
    """Queries a map's indexes answer; the others are left to its table."""

    def __init__(
        self,
        live: LiveMaps,
        store: RedisMapStore,
        gate: FreshnessGate,
        snapshots: TableSnapshots,
        reads: IndexReads,
    ) -> None:
        self._live = live
        self._store = store
        self._gate = gate
        self._snapshots = snapshots
        self._reads = reads
        self._plans: OrderedDict[tuple[Any, ...], _Query] = OrderedDict()

    async def query(
        self,
        request: pb.QueryRequest,
        context: grpc.aio.ServicerContext,
        table: Callable[[], AsyncIterator[pb.QueryResponse]],
    ) -> AsyncIterator[pb.QueryResponse] | None:
        """The query's pages through an index, or ``None`` when none serves it. ``table``:
        the table's pages, which answer instead when the index cannot be read as found
        before a page went out (``IndexUnread``, or an entity the table's types do not
        read)."""
        if not self._live.config.maps[request.map].indexes or not request.WhichOneof("filter"):
            return None
        token = PageToken.decode(request.page_token) if request.page_token else None
        if token is not None and token.entry is None:
            return None  # a continuation of a query the table answered
        generation = await self._store.generation(request.map)
        physical = physical_name(request.map, generation)
        ready = await self._reads.ready(physical)
        snapshot = await self._snapshots.recent(request.map, generation)
        query = self._plan(request, physical, ready, snapshot.table)
        if token is not None:
            token.check(query.fingerprint)
            if query.scan is None or token.last_key != query.field:
                raise InvalidArgument(
                    "page_token: the index this query read no longer answers it (dropped, "
                    "being built again, or another serves it now); send the query again "
                    "without the token"
                )
        if query.scan is None:
            return None
        if token is None and request.freshness.min_offsets:
            wanted = request.freshness.min_offsets
            await self._gate.wait(request.map, wanted, context.time_remaining())
        return self._pages(query, request, token, table)

    def _plan(
        self, request: pb.QueryRequest, physical: str, ready: dict[str, str], table: DeltaTable
    ) -> _Query:
        """The query's plan for this table version and these ready indexes, kept for the
        next call that asks the same (parsing a filter costs more than reading its rows)."""
        kind = request.WhichOneof("filter")
        said = (
            request.where
            if kind == "where"
            else request.predicate.SerializeToString(deterministic=True)
        )
        key = (physical, table.version(), said, tuple(request.fields), tuple(sorted(ready.items())))
        query = self._plans.get(key)
        if query is not None:
            self._plans.move_to_end(key)
            return query
        tables = self._snapshots.tables
        columns = tables.columns(request.map, table)
        filter_sql = render_filter(request, columns)
        schema = pa.schema(table.schema().to_arrow())
        meta = tables.meta_columns(request.map)
        own = [sql.identifier(m) for m in meta if m != TABLE_KEY]
        scan = index_scan(filter_sql, ready, {f.name: f.type for f in schema})
        if any(name in (filter_sql or "") for name in own):
            scan = None  # the table's own columns are the table's to answer
        fields = query_plan.projection(request, columns, meta)
        reading = entity_schema(schema, meta)
        stamp = fingerprint(physical + " index", filter_sql, fields)
        query = _Query(request.map, scan, physical, filter_sql, fields, reading, stamp)
        query.as_stored = scan is not None and scan.exact and not request.fields
        query.version = table.version()
        self._plans[key] = query
        while len(self._plans) > PLANS:
            self._plans.popitem(last=False)
        return query

    async def _pages(
        self,
        query: _Query,
        request: pb.QueryRequest,
        token: PageToken | None,
        table: Callable[[], AsyncIterator[pb.QueryResponse]],
    ) -> AsyncIterator[pb.QueryResponse]:
        page_size, limit = query_plan.page_size(request), query_plan.limit(request)
        after = token.entry if token is not None else None
        sent = token.sent if token is not None else 0
        first = token is None
        while True:
            watermark = await self._store.watermark(request.map)
            wanted = page_size if not limit else min(page_size, limit - sent)
            try:
                rows, after, more = await self._page(query, after, wanted)
            except IndexUnread as exc:
                if not first:
                    raise StoreUnavailable(
                        f"map {request.map!r}: {exc}; send the query again without its page_token"
                    ) from None
                async for page in table():  # nothing went out yet: the table answers
                    yield page
                return
            first = False
            sent += len(rows)
            more = more and (not limit or sent < limit)
            next_token = PageToken(query.version, query.field, sent, query.fingerprint, after)
            response = pb.QueryResponse(
                rows=[pb.Row(key=key, entity=entity) for key, entity in rows],
                page_token=next_token.encode() if more else "",
                table_version=query.version,
                source=pb.QueryResponse.REDIS_INDEX,
                index=query.field,
            )
            if watermark is not None:
                response.watermark.CopyFrom(watermark_to_proto(watermark))
            yield response
            if not more:
                return

    async def _page(
        self, query: _Query, after: bytes | None, wanted: int
    ) -> tuple[list[tuple[str, bytes]], bytes | None, bool]:
        """Up to ``wanted`` rows after entry ``after``: the rows, the last entry read, and
        whether entries may remain."""
        rows: list[tuple[str, bytes]] = []
        scan = query.scan
        while scan is not None and len(rows) < wanted:
            count = max(MIN_ROUND, min(MAX_ROUND, 2 * (wanted - len(rows))))
            entries = await self._reads.entries(query.physical, scan, after, count)
            if not entries:
                return rows, after, False
            # DataFusion blocks: on a worker thread; entities as stored need no work.
            kept = (
                query.kept(entries)
                if query.as_stored
                else await asyncio.to_thread(query.kept, entries)
            )
            for place, key, entity in kept:
                if len(rows) == wanted:  # read on from the entry before this row's
                    return rows, entries[place - 2][0] if place > 1 else after, True
                rows.append((key, entity))
            after = entries[-1][0]
            if len(entries) < count:
                return rows, after, False
        return rows, after, scan is not None


class _Query:
    """One query through an index: what each round of candidates is checked and shaped by."""

    def __init__(
        self,
        map_name: str,
        scan: IndexScan | None,
        physical: str,
        filter_sql: str | None,
        fields: tuple[str, ...],
        reading: pa.Schema,
        stamp: str,
    ) -> None:
        self.map_name = map_name
        self.scan = scan
        self.field = "" if scan is None else scan.field
        self.physical = physical
        self.fields = fields
        self.reading = reading
        self.fingerprint = stamp
        self.version = 0
        self.as_stored = False
        """The entries are the answer and every field is asked for: each row is its entity
        as Redis holds it, which is the JSON a table row of it encodes to, byte for byte."""
        where = f" WHERE {filter_sql}" if filter_sql else ""
        columns = ", ".join(sql.identifier(c) for c in (ORDINAL, TABLE_KEY, *fields))
        self.select = (
            f"SELECT {columns} FROM {sql.identifier(TABLE)}{where} "  # noqa: S608 - checked SQL
            f"ORDER BY {sql.identifier(ORDINAL)}"
        )

    def kept(self, entries: list[Entry]) -> list[tuple[int, str, bytes]]:
        """The candidates the filter keeps: each one's place among ``entries`` (from 1), key
        and projected entity, in order (blocking: DataFusion)."""
        present = [(i, e, v) for i, (e, v) in enumerate(entries, 1) if v is not None]
        if self.as_stored or not present:
            return [(i, key_of(e), v) for i, e, v in present]
        keys = [key_of(e) for _, e, _ in present]
        batch = typed_rows(self.reading, keys, [v for _, _, v in present])
        if batch is None:  # a double the pipeline wrote as "NaN", say: the table reads it
            raise IndexUnread(f"map {self.map_name!r}: an entity does not read as its table's row")
        batch = batch.append_column(ORDINAL, pa.array([i for i, _, _ in present], pa.int64()))
        result = filtered(batch, self.select, self.map_name)
        places = result.column(ORDINAL).to_pylist()
        encoded = encode_rows(result.drop_columns([ORDINAL]), TABLE_KEY)
        return [(place, key, entity) for place, (key, entity) in zip(places, encoded, strict=True)]
