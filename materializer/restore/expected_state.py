"""The state a map's Redis copy should hold, read from its durable copies: the Delta
table with the changelog tail on top, and the watermark of the fold's last committed
batch.

Redis is a projection that can always be rebuilt (``docs/redis-layout.md``): the
Delta table holds every entity as of the Delta query's last MERGE, and the map's
changelog topic holds every change after it. ``rehydrate`` writes this state,
``verify`` compares Redis with it, and a run restores a lost copy from it
(``restore.automatic``).

A map with ``ttl.redis`` expires keys in Redis: each entity gets what remains of
its TTL since it was last written (the table's ``_updated_at``, or the tail
record's Kafka timestamp), and one whose TTL has run out is not expected at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from materializer.checkpoints.files import CheckpointFiles
from materializer.clients.group_positions import committed
from materializer.clients.kafka_offsets import admin_client, partition_ids
from materializer.clients.object_store import delta_rs_location
from materializer.config import AppConfig
from materializer.config.names import LIVE_GROUP, changelog_topic, checkpoint_path
from materializer.contract.entity_json import encode_columns
from materializer.contract.redis_layout import logical_name, physical_name
from materializer.contract.table_layout import TABLE_KEY, TABLE_UPDATED_AT, table_meta, table_path
from materializer.contract.table_marks import table_positions
from materializer.contract.watermark import LIVE_APP, Watermark
from materializer.errors import MaterializerError
from materializer.redis.expiry import expiry_ms
from materializer.restore.changelog_tail import Tail, read_tail

BATCH_ROWS = 16_384
"""Table rows encoded at a time: enough to amortize each Arrow kernel call over many rows."""


class TableError(MaterializerError):
    """The map's Delta table could not be read."""


def fold_watermark(config: AppConfig, physical: str) -> Watermark | None:
    """The watermark of what the map's changelog holds: where the real-time path's last
    transaction left the map when it folded it last (``live_watermark``), else the
    micro-batch fold's last committed batch (``batch_watermark``)."""
    batch = batch_watermark(config, physical)
    live = live_watermark(config, physical)
    if live is not None and (batch is None or _ahead(live.offsets, batch.offsets)):
        return live
    return batch


def live_watermark(config: AppConfig, physical: str) -> Watermark | None:
    """Where the real-time path's last committed transaction left the map: its changelog
    holds every record before those positions (None: the path never folded the map)."""
    name = logical_name(physical)
    topics = partition_ids(admin_client(config.kafka), config.map(name).source.topics)
    positions = committed(config.kafka, LIVE_GROUP.replace("{map}", name), topics)
    if not positions:
        return None
    return Watermark(
        batch_id=0, offsets=positions, updated_at_ms=int(time.time() * 1000), app_id=LIVE_APP
    )


def _ahead(live: dict[str, dict[int, int]], batch: dict[str, dict[int, int]]) -> bool:
    """Whether the real-time path's positions are past the micro-batch fold's: the path a
    map moved to last starts where the other stopped, then only moves on."""
    pairs = [(o, batch.get(t, {}).get(p, -1)) for t, ps in live.items() for p, o in ps.items()]
    return any(a > b for a, b in pairs) and all(a >= b for a, b in pairs)


def batch_watermark(config: AppConfig, physical: str) -> Watermark | None:
    """The watermark the fold's last committed batch wrote, as ``WatermarkSink`` wrote it.

    The time is when Spark planned the batch (the sink's own clock is gone);
    no committed batch means no watermark.
    """
    files = CheckpointFiles(checkpoint_path(config, physical, "fold"), config.object_store)
    if not files.exists():
        return None
    batch = files.last_committed()
    if batch is None:
        return None
    return Watermark(
        batch_id=batch,
        offsets=files.end_offsets(batch),
        updated_at_ms=files.batch_timestamp_ms(batch),
        # The pipeline's Projector.app_id: the query id, then the physical map name.
        app_id=f"{files.query_id()}:{physical}",
    )


def delta_offsets(config: AppConfig, physical: str, topic: str) -> dict[int, int] | None:
    """Where the Delta query stands in the changelog: its last committed batch's end offsets.

    ``None`` when it never committed a batch: the whole changelog is the tail.
    """
    files = CheckpointFiles(checkpoint_path(config, physical, "delta"), config.object_store)
    if not files.exists():
        return None
    batch = files.last_committed()
    if batch is None:
        return None
    return files.end_offsets(batch).get(topic, {})


@dataclass
class EntityBatch:
    """Entity keys (string) and their JSON (binary), and how many source rows they came from.

    ``expiry_ms``: with ``ttl.redis``, the milliseconds each key has left (int64, > 0).
    """

    keys: pa.Array
    values: pa.Array
    source_rows: int
    expiry_ms: pa.Array | None = None
    expired: int = 0
    """Source entities left out because their ``ttl.redis`` has run out."""


@dataclass
class ExpectedState:
    """What a map's Redis copy should hold: the Delta table with the changelog tail on top."""

    map_name: str
    generation: int
    table_uri: str
    table_version: int | None
    table_rows: int
    tail: Tail
    _dataset: Any = field(default=None, repr=False)
    meta: tuple[str, ...] = (TABLE_KEY,)
    """The table's columns that are not entity fields (``contract.table_layout.table_meta``)."""
    ttl_ms: int | None = None
    """The map's ``ttl.redis``."""
    clock_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000), repr=False)
    """Now, in epoch milliseconds: what remains of each TTL is counted from it, per batch."""

    @property
    def physical(self) -> str:
        """Where this generation's data lives."""
        return physical_name(self.map_name, self.generation)

    @property
    def source_rows(self) -> int:
        """Rows ``batches`` goes through: for progress bars."""
        return self.table_rows + self.tail.upserts

    @classmethod
    def open(cls, config: AppConfig, map_name: str, generation: int) -> ExpectedState:
        """Pin the table's latest version and read the changelog tail after it.

        The Delta checkpoint is read first and the log ends last: the table is
        at least as new as that checkpoint (a MERGE commits before its batch
        does), and every change after the checkpoint is in the tail, so the
        later record wins even where the table already has it. The tail starts
        where the pinned version's MERGE says it merged the changelog when that is
        further (the real-time path's shared Delta query merged it, and the map's
        own checkpoint stood still meanwhile).
        """
        physical = physical_name(map_name, generation)
        topic = changelog_topic(config, map_name, generation)
        start = delta_offsets(config, physical, topic)
        uri = table_path(config, physical)
        version, rows, dataset, merged = _open_table(*delta_rs_location(config, uri), topic)
        if merged:
            own = start or {}
            start = {p: max(o, own.get(p, 0)) for p, o in {**own, **merged}.items()}
        tail = read_tail(config.kafka, topic, start)
        map_config = config.map(map_name)
        ttl = expiry_ms(map_config.ttl.redis if map_config.ttl else None)
        return cls(
            map_name, generation, uri, version, rows, tail, dataset, table_meta(map_config), ttl
        )

    def batches(self) -> Iterator[EntityBatch]:
        """Every entity exactly once: table rows the tail does not override, then the tail's.

        Keys the tail deletes are in neither, so the pairs are the final state
        and a writer never has to undo one. With ``ttl.redis``, keys whose TTL
        has run out are in neither too.
        """
        changes = self.tail.changes
        overridden = pa.array(list(changes), pa.string()) if changes else None
        if self._dataset is not None:
            for batch in self._dataset.to_batches(batch_size=BATCH_ROWS):
                if batch.num_rows == 0:
                    continue
                keys, values = encode_columns(batch, TABLE_KEY, self.meta)
                keep = None
                if overridden is not None:
                    keep = pc.invert(pc.is_in(keys, value_set=overridden))
                written_at = None
                if TABLE_UPDATED_AT in batch.schema.names:
                    millis = pa.timestamp("ms", "UTC")
                    written_at = pc.cast(
                        pc.cast(batch.column(TABLE_UPDATED_AT), millis, safe=False), pa.int64()
                    )
                yield self._entities(keys, values, written_at, keep, batch.num_rows)
        live = [(k, v) for k, v in changes.items() if v is not None]
        stamps = self.tail.timestamps
        for start in range(0, len(live), BATCH_ROWS):
            chunk = live[start : start + BATCH_ROWS]
            yield self._entities(
                pa.array([k for k, _ in chunk], pa.string()),
                pa.array([v for _, v in chunk], pa.binary()),
                pa.array([stamps.get(k) for k, _ in chunk], pa.int64()),
                None,
                len(chunk),
            )

    def _entities(
        self,
        keys: pa.Array,
        values: pa.Array,
        written_at: pa.Array | None,
        keep: pa.Array | None,
        source_rows: int,
    ) -> EntityBatch:
        """The kept entities, with what remains of their TTL (the whole TTL where the time they
        were written, epoch ms, is unknown); those whose TTL has run out left out."""
        expiry = None
        expired = 0
        if self.ttl_ms is not None:
            full = pa.scalar(self.ttl_ms, pa.int64())
            if written_at is None:
                expiry = pa.array([self.ttl_ms] * len(keys), pa.int64())
            else:
                age = pc.subtract(pa.scalar(self.clock_ms(), pa.int64()), written_at)
                expiry = pc.fill_null(pc.min_element_wise(pc.subtract(full, age), full), full)
            alive = pc.greater(expiry, 0)
            candidates = len(keys) if keep is None else _count(keep)
            keep = alive if keep is None else pc.and_(keep, alive)
            expired = candidates - _count(keep)
        if keep is None:
            return EntityBatch(keys, values, source_rows)
        return EntityBatch(
            pc.filter(keys, keep),
            pc.filter(values, keep),
            source_rows,
            None if expiry is None else pc.filter(expiry, keep),
            expired,
        )


def _count(mask: pa.Array) -> int:
    """How many rows a boolean mask keeps."""
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def _open_table(
    uri: str, options: dict[str, str] | None, changelog: str
) -> tuple[int | None, int, Any, dict[int, int]]:
    """(version, rows by the log's statistics, dataset, how far the version merged
    ``changelog``); a table not created yet is empty."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        table = DeltaTable(uri, storage_options=options)
        actions = pa.table(table.get_add_actions(flatten=True))
        counts = actions.column("num_records") if "num_records" in actions.column_names else None
        rows = int(pc.sum(counts).as_py() or 0) if counts is not None else 0
        merged = table_positions(table, changelog)
        return table.version(), rows, table.to_pyarrow_dataset(), merged
    except TableNotFoundError:
        return None, 0, None, {}
    except (DeltaError, OSError) as exc:
        raise TableError(f"Delta table {uri}: {exc}") from None
