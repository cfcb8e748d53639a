"""A map's Delta tables: where they live and the columns that are not entity fields.

The materializer writes them and the query service, ``rehydrate`` and
``verify`` read them, each with its own engine (Spark, delta-rs), so what a
row means is fixed here: ``_key`` is the entity key (the Redis key's suffix),
every other column but ``_updated_at`` is an entity field. A column added after the
table's creation (a field a map gained while it ran) has a comment that says which
commit added it and when (``AddedColumn``), so every reader can tell.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass

from materializer.config import AppConfig, MapConfig


def table_path(config: AppConfig, map_name: str) -> str:
    """The map's Delta table: ``<delta.root>/<map>``."""
    return f"{config.delta.root.rstrip('/')}/{map_name}"


def history_path(config: AppConfig, map_name: str) -> str:
    """The raw-event history table of a map."""
    return f"{table_path(config, map_name)}__events"


TABLE_KEY = "_key"
"""The key column of a map's Delta table."""
TABLE_UPDATED_AT = "_updated_at"
"""When a table row last changed (its changelog record's Kafka timestamp, UTC). Only tables of
maps with ``ttl.delta`` have it: the retention cleanup deletes rows by it. Not an entity field."""


def table_meta(map_config: MapConfig) -> tuple[str, ...]:
    """The columns of a map's table that are not entity fields, which readers leave out."""
    ttl = map_config.ttl
    return (TABLE_KEY, TABLE_UPDATED_AT) if ttl and ttl.delta else (TABLE_KEY,)


COMMENT = "comment"
"""A column's comment in the table's schema (Delta's field metadata, Spark's ``COMMENT``)."""
_ADDED = re.compile(r"added at table version (\d+), (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)")


@dataclass(frozen=True)
class AddedColumn:
    """When a column came into a table after its creation: the version of the commit that
    added it (its history's ``ADD COLUMNS``) and the time, ISO 8601 in UTC."""

    version: int
    at: str

    def comment(self) -> str:
        """The column's comment that records it (``COMMENT``)."""
        return f"added at table version {self.version}, {self.at}"

    @classmethod
    def now(cls, version: int) -> AddedColumn:
        """Added by the commit ``version`` about to be made."""
        at = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
        return cls(version, at.replace("+00:00", "Z"))

    @classmethod
    def of_field(cls, metadata: Mapping[bytes, bytes] | None) -> AddedColumn | None:
        """What a column's Arrow field metadata (its comment) records, or None."""
        return cls.of((metadata or {}).get(COMMENT.encode(), b"").decode())

    @classmethod
    def of(cls, comment: str | None) -> AddedColumn | None:
        """What a column's comment records, or None: a column of the table's creation (or
        one whose comment someone else wrote)."""
        found = _ADDED.fullmatch(comment or "")
        return cls(int(found.group(1)), found.group(2)) if found else None
