"""A Query request checked against its table: the SQL of each fetch and the paging rules.

Rows come in key order, a bounded number per engine query: each fetch asks
for the rows after the last key sent, ``ORDER BY _key LIMIT n``, so the engine
keeps only the top ``n`` rows while it scans and memory stays bounded however
big the table is. One fetch serves several pages, so a table is scanned once
per ``PAGES_PER_FETCH`` pages rather than once per page.
"""

from __future__ import annotations

from dataclasses import dataclass

from materializer.contract.redis_layout import physical_name
from materializer.contract.table_layout import TABLE_KEY
from materializer.v1 import map_service_pb2 as pb
from query_service.errors import InvalidArgument
from query_service.filters import sql
from query_service.filters.columns import Columns
from query_service.stores.delta import TABLE
from query_service.tables.page_token import fingerprint

DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 10_000
PAGES_PER_FETCH = 8


@dataclass(frozen=True)
class QueryPlan:
    """What every page of one query reads: one table version, one filter, one projection."""

    map_name: str
    version: int
    filter_sql: str | None
    fields: tuple[str, ...]
    page_size: int
    limit: int
    """Rows in all, over every page and continuation; 0: no limit."""
    generation: int = 0
    """The copy of the map read: a rebuild's new table has versions of its own."""

    @property
    def fingerprint(self) -> str:
        """What a page token of this query must carry (``page_token.fingerprint``)."""
        return fingerprint(
            physical_name(self.map_name, self.generation), self.filter_sql, self.fields
        )

    def fetch_size(self, sent: int) -> int:
        """Rows to ask the engine for next, once ``sent`` rows have gone out (0: done)."""
        size = self.page_size * PAGES_PER_FETCH
        return size if not self.limit else max(0, min(size, self.limit - sent))

    def has_more(self, fetched: int, asked: int, sent: int) -> bool:
        """Whether rows remain after this fetch: the engine had more, and the limit allows."""
        return fetched > asked and (not self.limit or sent < self.limit)

    def select(self, after: str | None, rows: int) -> str:
        """The SQL of one fetch: the next ``rows`` matching rows after key ``after``."""
        conditions = [self.filter_sql] if self.filter_sql else []
        if after is not None:
            conditions.append(f"{sql.identifier(TABLE_KEY)} > {sql.string(after)}")
        return sql.select(
            (TABLE_KEY, *self.fields), TABLE, conditions, order_by=TABLE_KEY, limit=rows
        )


def page_size(request: pb.QueryRequest) -> int:
    """The request's page size: 0 means the default; beyond the maximum is refused."""
    if request.page_size < 0 or request.page_size > MAX_PAGE_SIZE:
        raise InvalidArgument(
            f"page_size: {request.page_size}, must be 0 (default {DEFAULT_PAGE_SIZE}) "
            f"to {MAX_PAGE_SIZE}"
        )
    return request.page_size or DEFAULT_PAGE_SIZE


def limit(request: pb.QueryRequest) -> int:
    """The request's row limit (0: none); negative is refused."""
    if request.limit < 0:
        raise InvalidArgument(f"limit: {request.limit}, must be 0 (no limit) or more")
    return request.limit


def projection(
    request: pb.QueryRequest, columns: Columns, meta: tuple[str, ...] = (TABLE_KEY,)
) -> tuple[str, ...]:
    """The entity columns to return, in table order: the requested ones, or all.

    ``meta`` are the table's own columns (``_key``, ``_updated_at``): never entity
    fields. They may be listed and are ignored: the key always comes back as ``Row.key``.
    """
    entity = [c for c in columns.names if c not in meta]
    if not request.fields:
        return tuple(entity)
    wanted = {columns.exact(f, f"fields[{i}]") for i, f in enumerate(request.fields)}
    return tuple(c for c in entity if c in wanted)
