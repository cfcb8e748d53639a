"""Rebuild a Redis map from its Delta table and changelog (``ops.verify`` checks one).

The state Redis should hold is the Delta table with the changelog tail on top
(``restore.expected_state``); ``rehydrate`` writes it, ``verify`` compares Redis
with it. Both run while the map is held still (``MapControl.held``), so nothing
moves under them.

The watermark comes from the fold query's checkpoint: its last committed batch
is the last one whose Redis and changelog writes both returned, so the
rehydrated entities are at least as new as the watermark says, as after any
batch the pipeline writes.

A map with ``ttl.redis`` expires keys in Redis: each entity gets what remains of
its TTL since it was last written (the table's ``_updated_at``, or the tail
record's Kafka timestamp), and one whose TTL has run out is not expected at all.
A table without ``_updated_at`` (no ``ttl.delta``) cannot tell: its rows get the
full TTL, and verify reports the keys Redis already expired as missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from materializer.clients.redis import Client
from materializer.config import AppConfig
from materializer.contract.control import MapControl
from materializer.contract.markers import mark_whole
from materializer.contract.redis_layout import meta_key, physical_name
from materializer.contract.watermark import Watermark
from materializer.redis.expiry import index_expiring
from materializer.redis.indexes import declare as declare_indexes
from materializer.redis.indexes import rebuild as rebuild_indexes
from materializer.redis.map_keys import entity_keys
from materializer.restore.bulk import bulk_writer
from materializer.restore.changelog_tail import Tail
from materializer.restore.expected_state import ExpectedState, fold_watermark

Progress = Callable[[int], None]
"""Told how many source rows (table rows, then tail entities) were just handled."""


def _prefixed(physical: str, keys: pa.Array) -> pa.Array:
    """``<physical>:<key>`` of each entity key, as binary."""
    return pc.binary_join_element_wise(f"{physical}:".encode(), pc.cast(keys, pa.binary()), b"")


@dataclass
class RehydrateReport:
    """What ``rehydrate`` did."""

    map_name: str
    generation: int
    physical: str
    paused: bool
    table_version: int | None
    table_rows: int
    tail: Tail
    written: int
    removed: int
    watermark: Watermark | None
    seconds: float
    expired: int = 0
    """Entities not written because their ``ttl.redis`` had run out."""


def rehydrate(
    config: AppConfig,
    map_name: str,
    client: Client,
    *,
    generation: int | None = None,
    on_start: Callable[[ExpectedState], None] | None = None,
    on_progress: Progress | None = None,
) -> RehydrateReport:
    """Make Redis hold exactly the map's expected state, then its fold watermark.

    Entities go first and the watermark last, the pipeline's own write order,
    so a lookup during the load never sees a watermark ahead of its entity.
    Keys Redis holds that the expected state does not (stale, or deleted in the
    tail) are removed after the load; the map's indexes are built again last.
    """
    config.map(map_name)
    control = MapControl(client, map_name)
    gen = control.generation() if generation is None else generation
    physical = physical_name(map_name, gen)
    started = time.monotonic()
    with control.held() as paused:
        existing: set[bytes] = set()
        for page in entity_keys(client, physical):
            existing.update(page)
        state = ExpectedState.open(config, map_name, gen)
        if on_start is not None:
            on_start(state)
        expired = 0
        # The indexes go first: the load writes entities without their entries.
        declare_indexes(client, physical, [])
        with bulk_writer(client) as writer:
            for batch in state.batches():
                keys = _prefixed(physical, batch.keys)
                if batch.expiry_ms is None:
                    writer.mset(keys, batch.values)
                else:
                    writer.set_expiring(keys, batch.values, batch.expiry_ms)
                    index_expiring(
                        client, physical, batch.keys.to_pylist(), batch.expiry_ms.to_pylist()
                    )
                expired += batch.expired
                if existing:
                    existing.difference_update(keys.to_pylist())
                if on_progress is not None:
                    on_progress(batch.source_rows)
            removed = writer.delete(sorted(existing))
        watermark = fold_watermark(config, physical)
        with client.pipeline(transaction=True) as pipe:
            pipe.delete(meta_key(physical))
            if watermark is not None:
                pipe.hset(meta_key(physical), mapping=dict(watermark.to_hash()))  # type: ignore[arg-type]
            pipe.execute()
        mark_whole(client, physical)
        map_config = config.map(map_name)
        rebuild_indexes(
            client,
            physical,
            map_config.indexes,
            map_config.ttl is not None and map_config.ttl.redis is not None,
        )
    return RehydrateReport(
        map_name=map_name,
        generation=gen,
        physical=physical,
        paused=paused,
        table_version=state.table_version,
        table_rows=state.table_rows,
        tail=state.tail,
        written=writer.written,
        removed=removed,
        watermark=watermark,
        seconds=time.monotonic() - started,
        expired=expired,
    )
