"""The Delta query of a map: the changelog topic MERGEd into the map's table batch by
batch, the last record per key winning, with the table's TTL cleanup between batches.
Each MERGE records the source offsets its version reflects (``delta.marks``) and how far
it merged the changelog; a query whose checkpoint stands behind that (the map folded on
the real-time path meanwhile, whose maps share a Delta query) starts where the table
stands (``delta.positions``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.batch import Batch, Sink
from materializer.checkpoints.files import CheckpointFiles
from materializer.checkpoints.running import Checkpoint
from materializer.clients.kafka_offsets import admin_client, partition_ids
from materializer.clients.object_store import delta_rs_location
from materializer.config import AppConfig, is_inferred
from materializer.config.durations import processing_time
from materializer.config.names import (
    changelog_topic,
    checkpoint_path,
)
from materializer.contract.redis_layout import physical_name
from materializer.contract.table_layout import table_meta, table_path
from materializer.delta import positions
from materializer.delta.marks import SourceOffsets
from materializer.delta.positions import MergedPositions
from materializer.delta.retention import Retention
from materializer.delta.sink import DeltaSink
from materializer.fold.entity_types import (
    changelog_entity,
    typed_batches,
)
from materializer.runtime.projector import DELTA_POOL, Projector
from materializer.source.kafka import kafka_options

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)


def last_per_key(changes: DataFrame) -> DataFrame:
    """The last change of each key in a batch of changelog records (a key has one partition),
    with its record's ``__timestamp`` if the records carry one."""
    from pyspark.sql import functions as F

    carried = [c.DELETED, c.ENTITY, *([c.TIMESTAMP] if c.TIMESTAMP in changes.columns else [])]
    last = F.max_by(
        F.struct(*[F.col(n).alias(n) for n in carried]),
        F.struct(F.col(c.PARTITION), F.col(c.OFFSET)),
    )
    return changes.groupBy(c.KEY).agg(last.alias("__last")).select(c.KEY, "__last.*")


def changes_per_batch(config: AppConfig) -> int:
    """The Delta query's bound on a batch: ``delta.max_changes_per_batch``, or the run's
    ``spark.max_offsets_per_trigger`` when that is smaller."""
    bound = config.delta.max_changes_per_batch
    run = config.spark.max_offsets_per_trigger
    return bound if run is None else min(bound, run)


def start_delta_query(
    spark: SparkSession,
    config: AppConfig,
    map_name: str,
    entity: StructType,
    rows_out: Callable[[str, int, int], None] | None,
    generation: int,
    *,
    catch_up: bool = False,
    owner_check: Callable[[], None] | None = None,
) -> StreamingQuery:
    """The changelog into the Delta table: MERGE per batch, ``txnVersion`` = this query's batch.

    ``catch_up``: everything the changelog holds now, then the query ends (a stop's last).
    ``owner_check``: in a worker group, raises if another worker took the map over; called
    before each batch's MERGE, so a fenced worker commits nothing more.
    """
    physical = physical_name(map_name, generation)
    map_config = config.map(map_name)
    inferred = is_inferred(map_config)
    # With ttl.delta each row keeps when the fold wrote its change: its record's Kafka timestamp.
    ttl = map_config.ttl if map_config.ttl and map_config.ttl.delta else None
    changelog = changelog_topic(config, map_name, generation)
    delta_checkpoint = checkpoint_path(config, physical, "delta")
    table = table_path(config, physical)
    location = delta_rs_location(config, table)
    merged = MergedPositions(location, changelog)
    checkpoint = Checkpoint(spark, delta_checkpoint)
    files = CheckpointFiles(delta_checkpoint, config.object_store)
    starting = positions.starting_offsets(
        merged, files, lambda: partition_ids(admin_client(config.kafka), [changelog])
    )
    if starting is not None:
        checkpoint.discard()
    changes = changelog_changes(spark, config, [changelog], starting, with_time=ttl is not None)
    changes = with_entity(changes, entity, inferred)
    sinks: list[Sink] = [] if owner_check is None else [OwnerGuard(owner_check)]
    sinks += delta_sinks(config, map_name, physical, checkpoint, merged)
    checkpoint.drop_unfinished_writes()
    projector = delta_projector(config, physical, sinks, checkpoint, rows_out)
    writer = changes.writeStream.queryName(f"{physical}.delta").option(
        "checkpointLocation", delta_checkpoint
    )
    if catch_up:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=processing_time(config.delta.trigger_interval))
    return writer.foreachBatch(
        typed_batches(projector, table, inferred, table_meta(map_config))
    ).start()


def changelog_changes(
    spark: SparkSession,
    config: AppConfig,
    changelogs: list[str],
    starting: str | None,
    *,
    with_time: bool,
) -> DataFrame:
    """The changelog records of ``changelogs`` as the Delta queries read them: committed
    records only, at most ``changes_per_batch`` a batch, each with its topic, key, deletion,
    JSON ``value``, position and (``with_time``) Kafka timestamp. ``starting``: Spark's
    ``startingOffsets`` JSON (None: the checkpoint's, or the earliest)."""
    from pyspark.sql import functions as F

    reader = spark.readStream.format("kafka")
    for key, value in kafka_options(config, changelogs, starting or "earliest").items():
        reader = reader.option(key, value)
    reader = reader.option("maxOffsetsPerTrigger", str(changes_per_batch(config)))
    # In a worker group the changelog is written in transactions: an aborted one (a fenced
    # worker's) is never merged.
    reader = reader.option("kafka.isolation.level", "read_committed")
    raw = reader.load()
    return raw.select(
        F.col("topic").alias(c.TOPIC),
        raw["key"].cast("string").alias(c.KEY),
        raw["value"].isNull().alias(c.DELETED),
        raw["value"].cast("string").alias("value"),
        F.col("partition").alias(c.PARTITION),
        F.col("offset").alias(c.OFFSET),
        *([F.col("timestamp").alias(c.TIMESTAMP)] if with_time else []),
    )


def with_entity(changes: DataFrame, entity: StructType, inferred: bool) -> DataFrame:
    """One map's changelog rows (``changelog_changes``) with its entities read: key,
    deletion, entity, position, timestamp."""
    return changes.select(
        c.KEY,
        c.DELETED,
        changelog_entity(changes["value"], entity, inferred).alias(c.ENTITY),
        *_positions(changes),
    )


def entities_collected(changes: DataFrame, entities: dict[str, StructType]) -> dict[str, pa.Table]:
    """``with_entity``'s rows of each changelog in ``entities`` (by topic, their entity
    structs, none schemaless), collected to the driver in Arrow by one job: every Spark
    job costs the driver and the cores its planning and tasks, whatever its size, and a
    job per map made sixteen maps' Delta batch sixteen jobs."""
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    if not entities:
        return {}
    topic, value = changes[c.TOPIC], changes["value"]
    read = [
        F.when(topic == changelog, changelog_entity(value, entity, False)).alias(f"{c.ENTITY}{i}")
        for i, (changelog, entity) in enumerate(entities.items())
    ]
    positions = _positions(changes)
    ours = changes.where(topic.isin(list(entities)))  # a map not among them is no column here
    rows = ours.select(c.TOPIC, c.KEY, c.DELETED, *read, *positions)
    table = rows.toArrow()
    collected = {}
    for i, changelog in enumerate(entities):
        columns = [c.TOPIC, c.KEY, c.DELETED, f"{c.ENTITY}{i}", *positions]
        own = table.select(columns)  # the other maps' entity columns are not copied
        own = own.filter(pc.equal(own[c.TOPIC], changelog)).drop_columns([c.TOPIC])
        collected[changelog] = own.rename_columns([c.KEY, c.DELETED, c.ENTITY, *positions])
    return collected


def _positions(changes: DataFrame) -> list[str]:
    return [n for n in changes.columns if n in (c.PARTITION, c.OFFSET, c.TIMESTAMP)]


def delta_sinks(
    config: AppConfig,
    map_name: str,
    physical: str,
    checkpoint: Checkpoint,
    merged: MergedPositions,
    mark_wait: float | None = None,
) -> list[Sink]:
    """A map's Delta sinks: its MERGE, recording what it reflects, then its TTL cleanup.
    ``mark_wait``: how long a MERGE waits for the mark of the fold batch it merged (None:
    ``delta.marks.MARK_WAIT_SECONDS``)."""
    map_config = config.map(map_name)
    ttl = map_config.ttl if map_config.ttl and map_config.ttl.delta else None
    table = table_path(config, physical)
    offsets = SourceOffsets(config.redis, physical, checkpoint.end_offsets, merged, mark_wait)
    sinks: list[Sink] = [
        DeltaSink(
            table,
            updated_at=ttl is not None,
            engine=config.delta.merge_engine,
            location=delta_rs_location(config, table),
            user_metadata=offsets.user_metadata,
            mark_only=offsets.mark_only,
        )
    ]
    if ttl is not None and ttl.delta is not None:
        # After the MERGE, in the same foreachBatch: the cleanup never races a MERGE.
        sinks.append(
            Retention(
                table,
                ttl=ttl.delta,
                interval=ttl.cleanup_interval,
                vacuum_retention=ttl.vacuum_retention,
            )
        )
    return sinks


def delta_projector(
    config: AppConfig,
    physical: str,
    sinks: list[Sink],
    checkpoint: Checkpoint,
    rows_out: Callable[[str, int, int], None] | None,
) -> Projector:
    """The projector of a map's Delta batches: each key's last change with Spark's MERGE
    (delta-rs's keeps it in Arrow)."""
    spark_merge = config.delta.merge_engine == "spark"

    return Projector(
        physical,
        sinks,
        checkpoint,
        rows_out,
        query="delta",
        prepare=last_per_key if spark_merge else None,
        pool=DELTA_POOL,
        # delta-rs's MERGE collects the rows once and counts them; Spark's reads them twice.
        persist=spark_merge,
        count=spark_merge,
    )


class OwnerGuard(Sink):
    """First of a map's Delta sinks in a worker group: a worker that lost the map stops before
    its MERGE (``materializer.group.fencing``)."""

    name = "owner"

    def __init__(self, check: Callable[[], None]) -> None:
        self._check = check

    def write(self, batch: Batch) -> None:
        """Raise if another worker owns the map now."""
        self._check()
