"""``Query``, ``GetAsOf`` and ``GetSchema``: reads of a map's Delta table through delta-rs
(no JVM).

Every delta-rs call blocks (log replay, Parquet reads, DataFusion), so each
runs on a worker thread and the event loop keeps serving other calls. A
query's pages are fetched a bounded number of rows at a time and streamed as
they come; the client's flow control holds back the next fetch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pyarrow as pa
from deltalake import DeltaTable

from materializer.catalog.live import LiveMaps
from materializer.config import AppConfig
from materializer.contract.entity_json import encode_rows
from materializer.contract.table_layout import TABLE_KEY, AddedColumn
from materializer.v1 import map_service_pb2 as pb
from query_service.errors import InvalidArgument
from query_service.filters import render_filter
from query_service.freshness import watermark_to_proto
from query_service.stores.delta import DeltaTables
from query_service.tables import query_plan
from query_service.tables.page_token import PageToken
from query_service.tables.query_plan import QueryPlan
from query_service.tables.snapshots import TableSnapshots
from query_service.tables.time_travel import entity_as_of

Rows = list[tuple[str, bytes]]


class TableReads:
    """Filtered, paged reads and time travel over the maps' Delta tables.

    Map names arrive validated against the configuration; a declared map whose
    table does not exist yet is NOT_FOUND.
    """

    def __init__(
        self,
        config: AppConfig | LiveMaps,
        generation: Callable[[str], Awaitable[int]] | None = None,
        snapshots: TableSnapshots | None = None,
    ) -> None:
        """``snapshots``: the process's latest snapshots, shared with its other table
        readers (SQL); without it the reads keep their own."""
        self._snapshots = (
            snapshots if snapshots is not None else TableSnapshots(DeltaTables(config))
        )
        self._tables = self._snapshots.tables
        self._generation = generation

    @property
    def snapshots(self) -> TableSnapshots:
        """The latest snapshots these reads share (their schemas type Redis entities too)."""
        return self._snapshots

    async def query(
        self, request: pb.QueryRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.QueryResponse]:
        """Pages of matching rows, ordered by key, all from one table version.

        Always at least one response (possibly without rows), so the caller
        learns the version read and the source offsets it reflects; the last
        one has an empty ``page_token``. A first page waits for
        ``freshness.min_offsets`` (``TableSnapshots.latest``); a continuation
        reads its token's version and waits for nothing.
        """
        page_size = query_plan.page_size(request)
        limit = query_plan.limit(request)
        token = PageToken.decode(request.page_token) if request.page_token else None
        generation = await self._generation(request.map) if self._generation else 0
        if token is None:
            wanted = request.freshness.min_offsets
            remaining = context.time_remaining() if wanted else None
            snapshot = await self._snapshots.latest(request.map, generation, wanted, remaining)
            table, watermark = snapshot.table, snapshot.watermark
        else:
            table = await asyncio.to_thread(
                self._tables.open, request.map, token.version, generation
            )
            watermark = await self._snapshots.watermark_of(request.map, generation, table)
        plan = await asyncio.to_thread(
            self._plan, request, table, page_size, limit, token, generation
        )
        mark = None if watermark is None else watermark_to_proto(watermark)
        after = token.last_key if token else None
        sent = token.sent if token else 0
        while True:
            asked = plan.fetch_size(sent)
            rows = await asyncio.to_thread(self._fetch, plan, table, after, asked) if asked else []
            fetched = len(rows)
            rows = rows[:asked]
            pages = [rows[i : i + plan.page_size] for i in range(0, len(rows), plan.page_size)]
            more = plan.has_more(fetched, asked, sent + len(rows))
            for i, page in enumerate(pages or [[]]):
                sent += len(page)
                resume = more or i < len(pages) - 1
                next_token = (
                    PageToken(plan.version, page[-1][0], sent, plan.fingerprint) if resume else None
                )
                yield pb.QueryResponse(
                    rows=[pb.Row(key=key, entity=entity) for key, entity in page],
                    page_token=next_token.encode() if next_token else "",
                    table_version=plan.version,
                    watermark=mark,
                    source=pb.QueryResponse.TABLE,
                )
            if not more:
                return
            after = rows[-1][0]

    async def get_as_of(
        self, request: pb.GetAsOfRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAsOfResponse:
        """One entity at a table version or at a point in time (see ``tables.time_travel``),
        with the source offsets that version reflects; first, with
        ``freshness.min_offsets``, the wait for the table's newest version to reflect them."""
        kind = request.WhichOneof("as_of")
        if kind is None:
            raise InvalidArgument("as_of: set version or timestamp")
        if kind == "version" and request.version < 0:
            raise InvalidArgument(f"version: {request.version}, must be 0 or more")
        at_ns = None
        if kind == "timestamp":
            at_ns = request.timestamp.seconds * 1_000_000_000 + request.timestamp.nanos
        generation = await self._generation(request.map) if self._generation else 0
        if request.freshness.min_offsets:
            await self._snapshots.latest(
                request.map, generation, request.freshness.min_offsets, context.time_remaining()
            )
        as_of = await asyncio.to_thread(
            entity_as_of,
            self._tables,
            request.map,
            request.key,
            version=request.version if kind == "version" else None,
            at_ns=at_ns,
            generation=generation,
        )
        response = pb.GetAsOfResponse(
            found=as_of.entity is not None,
            entity=as_of.entity or b"",
            table_version=as_of.commit.version,
        )
        response.committed_at.FromMilliseconds(as_of.commit.timestamp_ms)
        watermark = await self._snapshots.watermark_of(request.map, generation, as_of.snapshot)
        if watermark is not None:
            response.watermark.CopyFrom(watermark_to_proto(watermark))
        return response

    async def schema(self, request: pb.GetSchemaRequest) -> pb.GetSchemaResponse:
        """The map's fields in its table's newest version, each with the commit that added
        it when the map gained it while it ran (``AddedColumn``)."""
        generation = await self._generation(request.map) if self._generation else 0
        snapshot = await self._snapshots.latest(request.map, generation)
        own = set(self._tables.meta_columns(request.map))
        response = pb.GetSchemaResponse(map=request.map, table_version=snapshot.version)
        table_schema = pa.schema(snapshot.table.schema().to_arrow())
        for field in table_schema:
            if field.name in own:
                continue
            column = response.columns.add(name=field.name, type=str(field.type))
            added = AddedColumn.of_field(field.metadata)
            if added is not None:
                column.added_in_version = added.version
                column.added_at.FromJsonString(added.at)
        return response

    def _plan(
        self,
        request: pb.QueryRequest,
        table: DeltaTable,
        page_size: int,
        limit: int,
        token: PageToken | None,
        generation: int,
    ) -> QueryPlan:
        """Check the request against the columns of the snapshot to read (blocking).

        A token from before a rebuild names another table: it fails the check.
        """
        columns = self._tables.columns(request.map, table)
        plan = QueryPlan(
            map_name=request.map,
            version=table.version(),
            filter_sql=render_filter(request, columns),
            fields=query_plan.projection(request, columns, self._tables.meta_columns(request.map)),
            page_size=page_size,
            limit=limit,
            generation=generation,
        )
        if token is not None:
            token.check(plan.fingerprint)
        return plan

    def _fetch(self, plan: QueryPlan, table: DeltaTable, after: str | None, rows: int) -> Rows:
        """Up to ``rows + 1`` rows after ``after``: one more than asked tells whether any remain."""
        result = self._tables.select(plan.map_name, table, plan.select(after, rows + 1))
        return encode_rows(result, TABLE_KEY)
