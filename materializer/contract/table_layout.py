"""A map's Delta tables: where they live and the columns that are not entity fields.

The materializer writes them and the query service, ``rehydrate`` and
``verify`` read them, each with its own engine (Spark, delta-rs), so what a
row means is fixed here: ``_key`` is the entity key (the Redis key's suffix),
every other column but ``_updated_at`` is an entity field.
"""

from __future__ import annotations

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
