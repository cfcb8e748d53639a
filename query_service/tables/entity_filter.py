"""A filter decided over entities as Redis holds them, as the engine decides it over the
table's rows: for a change stream that sends only the changes after which an entity
matches (``Watch`` with a filter).

The filter is checked against the columns a Redis entity has (the table's, without its
own ``_updated_at``) and rendered as for a query (``render_filter``); the entities are
typed as the table types its rows (its newest schema, ``entity_rows``) and the filter is
applied by DataFusion, so an entity matches exactly when its row in the table would.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pyarrow as pa

from materializer.contract.table_layout import TABLE_KEY
from materializer.v1 import map_service_pb2 as pb
from query_service.filters import render_filter, sql
from query_service.stores.base import Change
from query_service.stores.delta import TABLE
from query_service.tables.entity_rows import entity_schema, filtered, typed_rows
from query_service.tables.snapshots import TableSnapshots


class EntityFilter:
    """Which of a map's entities one filter keeps (blocking: DataFusion)."""

    def __init__(self, map_name: str, filter_sql: str, reading: pa.Schema) -> None:
        self.map_name = map_name
        self._reading = reading
        key = sql.identifier(TABLE_KEY)
        self._select = f"SELECT {key} FROM {sql.identifier(TABLE)} WHERE {filter_sql}"  # noqa: S608 - checked SQL

    def matching(self, keys: Sequence[str], entities: Sequence[bytes]) -> set[str]:
        """The keys whose entity (compact JSON, one per key) the filter keeps. An entity
        that does not read as the table's row (a double written as "NaN", say) is decided
        alone: one such entity does not hide the others' matches."""
        batch = typed_rows(self._reading, keys, entities)
        if batch is None:
            if len(keys) == 1:
                return set()
            kept: set[str] = set()
            for key, entity in zip(keys, entities, strict=True):
                kept |= self.matching([key], [entity])
            return kept
        found = filtered(batch, self._select, self.map_name)
        return set(found.column(TABLE_KEY).to_pylist())


class ChosenChanges:
    """The changes a filtered change stream sends: those after which the entity matches,
    and with ``include_left`` the one after which an entity it sent as matching stops."""

    def __init__(self, matching: EntityFilter, include_left: bool) -> None:
        self._matching = matching
        self._include_left = include_left
        self._inside: set[str] = set()
        """Keys this stream sent as matching and not since as left (``include_left``)."""

    async def pick(
        self, changes: Sequence[Change], entities: dict[str, bytes | None]
    ) -> list[tuple[Change, bool]]:
        """The changes to send, in order, each with whether its entity left the filter;
        ``entities``: each upserted key's entity as read for these changes."""
        present = [(k, v) for k, v in entities.items() if v is not None]
        matched = (
            await asyncio.to_thread(
                self._matching.matching, [k for k, _ in present], [v for _, v in present]
            )
            if present
            else set()
        )
        sent: list[tuple[Change, bool]] = []
        for change in changes:
            if not change.deleted and entities.get(change.key) is None:
                continue  # deleted or expired since: its own change says so, now or next
            if not change.deleted and change.key in matched:
                if self._include_left:
                    self._inside.add(change.key)
                sent.append((change, False))
            elif change.key in self._inside:
                self._inside.discard(change.key)
                sent.append((change, True))
        return sent


async def entity_filter(
    request: pb.WatchRequest, snapshots: TableSnapshots, generation: int
) -> EntityFilter | None:
    """The request's filter over the map's entities; ``None`` when it sets none.
    ``InvalidArgument`` names what does not apply to the entities' columns."""
    if request.WhichOneof("filter") is None:
        return None
    snapshot = await snapshots.recent(request.map, generation)
    tables = snapshots.tables
    own = set(tables.meta_columns(request.map)) - {TABLE_KEY}
    columns = tables.columns(request.map, snapshot.table)
    seen = dataclasses.replace(columns, names=tuple(n for n in columns.names if n not in own))
    filter_sql = render_filter(request, seen)
    if filter_sql is None:
        return None
    schema = pa.schema(snapshot.table.schema().to_arrow())
    reading = entity_schema(schema, tables.meta_columns(request.map))
    matching = EntityFilter(request.map, filter_sql, reading)
    # Planned once over no rows: a filter the rows' types refuse (LIKE on a number) is
    # refused now, not at the first change that matches.
    await asyncio.to_thread(matching.matching, [], [])
    return matching
