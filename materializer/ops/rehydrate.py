"""Rebuild a Redis map from its Delta table and changelog, or check that Redis still matches them.

Redis is a projection that can always be rebuilt (``docs/redis-layout.md``):
the Delta table holds every entity as of the Delta query's last MERGE, and the
map's changelog topic holds every change after it. The state Redis should
hold is the table with that tail on top (:class:`ExpectedState`);
``rehydrate`` writes it, ``verify`` compares Redis with it. Both run while the
map is held still (``MapControl.held``), so nothing moves under them.

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

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from materializer.config import AppConfig
from materializer.errors import MaterializerError
from materializer.layout import Watermark, meta_key, physical_name
from materializer.object_store import delta_rs_location
from materializer.ops.changelog_tail import Tail, read_tail
from materializer.ops.checkpoint_files import CheckpointFiles
from materializer.ops.control import MapControl
from materializer.ops.entity_json import encode_columns
from materializer.ops.redis_bulk import bulk_writer, entity_keys, entity_values
from materializer.paths import checkpoint_path, table_path
from materializer.pipeline.columns import TABLE_KEY, TABLE_UPDATED_AT, table_meta
from materializer.redis_client import Client, mark_whole
from materializer.sinks.expiry import index_expiring
from materializer.sinks.redis import expiry_ms

BATCH_ROWS = 16_384
"""Table rows encoded at a time: enough to amortize each Arrow kernel call over many rows."""

Progress = Callable[[int], None]
"""Told how many source rows (table rows, then tail entities) were just handled."""


class TableError(MaterializerError):
    """The map's Delta table could not be read."""


def fold_watermark(config: AppConfig, physical: str) -> Watermark | None:
    """The watermark the fold's last committed batch wrote, as ``RedisSink`` wrote it.

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
    """The table's columns that are not entity fields (``columns.table_meta``)."""
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
        later record wins even where the table already has it.
        """
        # Imported here: the pipeline's module pulls in pyspark, which only this name needs.
        from materializer.pipeline.job import changelog_topic

        physical = physical_name(map_name, generation)
        topic = changelog_topic(config, map_name, generation)
        start = delta_offsets(config, physical, topic)
        uri = table_path(config, physical)
        version, rows, dataset = _open_table(*delta_rs_location(config, uri))
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


def _open_table(uri: str, options: dict[str, str] | None) -> tuple[int | None, int, Any]:
    """(version, rows by the log's statistics, dataset); a table not created yet is empty."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        table = DeltaTable(uri, storage_options=options)
        actions = pa.table(table.get_add_actions(flatten=True))
        counts = actions.column("num_records") if "num_records" in actions.column_names else None
        rows = int(pc.sum(counts).as_py() or 0) if counts is not None else 0
        return table.version(), rows, table.to_pyarrow_dataset()
    except TableNotFoundError:
        return None, 0, None
    except (DeltaError, OSError) as exc:
        raise TableError(f"Delta table {uri}: {exc}") from None


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
    tail) are removed after the load.
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


def value_digest(value: bytes) -> bytes:
    """A short hash of an entity's bytes: maps of key to digest compare a million entities
    without holding their JSON twice."""
    return hashlib.blake2b(value, digest_size=16).digest()


@dataclass
class Differences:
    """Keys of one kind of difference: the first few, and how many in all."""

    count: int = 0
    first: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    """What one copy of a map holds that another does not, or holds otherwise."""

    missing: Differences
    extra: Differences
    different: Differences

    @property
    def identical(self) -> bool:
        """No difference of any kind."""
        return not (self.missing.count or self.extra.count or self.different.count)


@dataclass
class VerifyReport:
    """Redis against the expected state: counts, differing keys, and the watermarks."""

    map_name: str
    generation: int
    physical: str
    paused: bool
    table_version: int | None
    table_rows: int
    tail: Tail
    expected: int
    actual: int
    stores: Comparison
    """Redis against the Delta table and changelog tail."""
    expected_watermark: Watermark | None
    actual_watermark: Watermark | None
    replayed: Comparison | None = None
    """A fold replayed from Kafka up to Redis's watermark against Redis (``--replay``)."""

    @property
    def watermark_matches(self) -> bool:
        """Batch, offsets and writer agree (the time is the writer's clock, never compared)."""
        return _watermark_identity(self.expected_watermark) == _watermark_identity(
            self.actual_watermark
        )

    @property
    def identical(self) -> bool:
        """Every entity and the watermark as expected."""
        return (
            self.stores.identical
            and self.watermark_matches
            and (self.replayed is None or self.replayed.identical)
        )


def _expired_keys(config: AppConfig, map_name: str, generation: int) -> set[str]:
    """Keys whose last changelog record is an expiry's tombstone (none without ``ttl.redis``);
    the whole compacted changelog is read, which keeps tombstones for a while only."""
    from materializer.pipeline.job import changelog_topic

    map_config = config.map(map_name)
    if map_config.ttl is None or map_config.ttl.redis is None:
        return set()
    return read_tail(config.kafka, changelog_topic(config, map_name, generation), None).expired


def _watermark_identity(
    mark: Watermark | None,
) -> tuple[int, dict[str, dict[int, int]], str] | None:
    return None if mark is None else (mark.batch_id, mark.offsets, mark.app_id)


def verify(
    config: AppConfig,
    map_name: str,
    client: Client,
    *,
    generation: int | None = None,
    show: int = 10,
    replay: Callable[[dict[str, dict[int, int]]], dict[str, bytes]] | None = None,
) -> VerifyReport:
    """Compare the map's Redis copy with its expected state, key by key, under the same hold.

    ``replay`` folds the map's topics again up to the given offsets and returns
    the digests it found (``ops.replay``); Redis is compared with that too,
    less the keys ``ttl.redis`` expired (their last changelog record is an
    expiry's tombstone), which a replay cannot know of.
    """
    config.map(map_name)
    control = MapControl(client, map_name)
    gen = control.generation() if generation is None else generation
    physical = physical_name(map_name, gen)
    with control.held() as paused:
        state = ExpectedState.open(config, map_name, gen)
        expected: dict[str, bytes] = {}
        for batch in state.batches():
            for key, value in zip(batch.keys.to_pylist(), batch.values.to_pylist(), strict=True):
                expected[key] = value_digest(value)
        actual = redis_digests(client, physical)
        actual_watermark = control.watermark(gen)
        expected_watermark = fold_watermark(config, physical)
    # Redis was read at its watermark; the replay stops at the same offsets, so the
    # map need not stay still while it runs.
    replayed = None
    if replay is not None and actual_watermark is not None:
        digests = replay(actual_watermark.offsets)
        for key in _expired_keys(config, map_name, gen):
            digests.pop(key, None)
        replayed = compare(digests, actual, show)
    return VerifyReport(
        map_name=map_name,
        generation=gen,
        physical=physical,
        paused=paused,
        table_version=state.table_version,
        table_rows=state.table_rows,
        tail=state.tail,
        expected=len(expected),
        actual=len(actual),
        stores=compare(expected, actual, show),
        expected_watermark=expected_watermark,
        actual_watermark=actual_watermark,
        replayed=replayed,
    )


def redis_digests(client: Client, physical: str) -> dict[str, bytes]:
    """Key to value digest of every entity of one copy of a map in Redis."""
    prefix = len(physical) + 1
    digests: dict[str, bytes] = {}
    for keys, values in entity_values(client, physical):
        for key, value in zip(keys, values, strict=True):
            if value is not None:
                digests[key[prefix:].decode()] = value_digest(value)
    return digests


def compare(expected: dict[str, bytes], actual: dict[str, bytes], show: int) -> Comparison:
    """Keys missing from ``actual``, extra in it, and with another value."""
    return Comparison(
        missing=_first(expected.keys() - actual.keys(), show),
        extra=_first(actual.keys() - expected.keys(), show),
        different=_first(
            {k for k in expected.keys() & actual.keys() if expected[k] != actual[k]}, show
        ),
    )


def _first(keys: set[str], show: int) -> Differences:
    return Differences(len(keys), sorted(keys)[:show])
