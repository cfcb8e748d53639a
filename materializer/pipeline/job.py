"""The streaming queries of one map, and the foreachBatch step that projects each batch.

Each map runs two queries, each with its own checkpoint under
``<checkpoint_root>/<map>/``, so one map's failure leaves the others running:

- ``fold``: read and decode the map's topics once per micro-batch; send the
  records that cannot be folded to the dead-letter topic (``on_error:
  dead_letter``; ``skip`` drops them, ``fail`` fails the query at the first);
  fold the rest into Redis and write the changelog topic (``redis_fold``);
  append every folded event to ``<root>/<map>__events`` (``history: true``);
  commit the watermark, then the batch's end offsets to the consumer group
  ``materializer.<map>`` for Kafka's tools to see (the checkpoint, not the
  group, is where the fold resumes). Every step is idempotent per batch.
- ``delta``: the changelog into the Delta table, one MERGE per trigger of
  ``delta.trigger_interval`` (exactly once through Delta's transaction ids).
  Lookups see a batch as soon as Redis has it; the table follows within a
  trigger or so, without ever slowing the fold down.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.config import KAFKA_KEY, AppConfig, is_inferred
from materializer.contract.kafka_clients import java, librdkafka
from materializer.contract.redis_layout import physical_name
from materializer.contract.table_layout import history_path, table_path
from materializer.errors import ConfigError
from materializer.pipeline.checkpoint import Checkpoint
from materializer.pipeline.crash import CrashDrill
from materializer.pipeline.decode import decode
from materializer.pipeline.formats.batch_typing import (
    EntityTyper,
    changelog_entity,
    typed_batches,
)
from materializer.pipeline.keys import assign_keys
from materializer.pipeline.metrics import BatchMetrics, observe_fold_input
from materializer.pipeline.progress import BatchLog
from materializer.pipeline.redis_fold import RedisFold, RedisFoldSink, producer_settings
from materializer.pipeline.redis_functions import FoldTarget, load_library
from materializer.pipeline.restore import ensure_whole
from materializer.pipeline.source import kafka_options, read_source
from materializer.pipeline.topics import ensure_changelog_topic, ensure_dead_letter_topic
from materializer.pipeline.transforms import apply_transforms
from materializer.resources import (
    MAP_GROUP,
    changelog_topic,
    checkpoint_path,
    dead_letter_topic,
)
from materializer.sinks.base import Batch, Sink
from materializer.sinks.delta import DeltaSink
from materializer.sinks.group_offsets import GroupOffsetsSink
from materializer.sinks.history import HistorySink
from materializer.sinks.redis import RedisSink, expiry_ms
from materializer.sinks.retention import Retention

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

FINISH_BATCH_TIMEOUT = 120.0

FOLD_POOL, DELTA_POOL = "fold", "delta"
"""The FAIR scheduler pools of the folds' jobs and of the Delta queries' jobs."""


class Projector:
    """The ``foreachBatch`` callback: runs on the driver, once per micro-batch (and per replay)."""

    def __init__(
        self,
        map_name: str,
        sinks: list[Sink],
        checkpoint: Checkpoint,
        on_rows_out: Callable[[str, int, int], None] | None = None,
        query: str = "fold",
        prepare: Callable[[DataFrame], DataFrame] | None = None,
        keep_records: bool = False,
        pool: str = FOLD_POOL,
        persist: bool = True,
    ) -> None:
        """``prepare`` turns the query's rows into the rows to project. With
        ``keep_records`` the query's rows are records, not folded rows: the sinks get
        them as ``Batch.records`` too, and the first sink to report ``rows_out`` (the
        fold in Redis) gives the batch's count. ``persist=False`` for a batch that only
        one sink reads."""
        self.map_name = map_name
        self.sinks = sinks
        self.checkpoint = checkpoint
        self.query = query
        self._prepare = prepare
        self._keep_records = keep_records
        self._pool = pool
        self._persist = persist
        self._on_rows_out = on_rows_out
        self._app_id: str | None = None
        self._drill = CrashDrill()

    def app_id(self) -> str:
        """The streaming query id plus the map name: new with every new checkpoint."""
        if self._app_id is None:
            self._app_id = f"{self.checkpoint.query_id()}:{self.map_name}"
        return self._app_id

    def close(self) -> None:
        """Release the sinks' clients; the query has stopped."""
        for sink in self.sinks:
            sink.close()

    def __call__(self, rows: DataFrame, batch_id: int) -> None:
        """Project one batch into every sink, in order."""
        started = time.monotonic()
        # The jobs this callback submits run in the query's pool (set per thread).
        rows.sparkSession.sparkContext.setLocalProperty("spark.scheduler.pool", self._pool)
        records = rows if self._keep_records else None
        if self._prepare is not None:
            rows = self._prepare(rows)
        # The batch is read by each sink; caching it reads and computes it once.
        if self._persist:
            rows.persist()
        try:
            # With the records kept, the first sink makes the rows out and counts them.
            count = None if records is not None else rows.count()
            batch = Batch(
                rows=rows, batch_id=batch_id, app_id=self.app_id(), records=records, count=count
            )
            self._drill.batch_started()
            for sink in self.sinks:
                sink.write(batch)
                self._drill.sink_written(sink.name)
                if count is None:
                    count = sink.rows_out()
        finally:
            if self._persist:
                rows.unpersist()
        count = count or 0
        if self._on_rows_out is not None:
            self._on_rows_out(f"{self.map_name}.{self.query}", batch_id, count)
        log.debug(
            "query=%s.%s batch=%d rows_out=%d projected_ms=%d",
            self.map_name,
            self.query,
            batch_id,
            count,
            (time.monotonic() - started) * 1000,
        )


@dataclass
class MapQueries:
    """The running queries of one map: the fold, then its side queries (Delta, dead letters...).

    The Delta query comes first among them: it takes what the fold wrote.
    """

    name: str
    fold: StreamingQuery
    side: list[StreamingQuery] = field(default_factory=list)
    projectors: list[Projector] = field(default_factory=list)
    """Closed once the queries stop, releasing the clients their sinks keep."""
    catch_up: Callable[[], StreamingQuery] | None = None
    """Starts the Delta query once more, to take in everything the changelog holds and end
    (``availableNow``): what a stop runs after the fold has stopped."""

    @property
    def queries(self) -> list[StreamingQuery]:
        """The map's queries, fold first."""
        return [self.fold, *self.side]

    def process_all_available(self) -> None:
        """Block until everything in the topics right now is folded, dead-lettered, recorded."""
        for query in self.queries:
            query.processAllAvailable()

    def stop(self) -> None:
        """Stop the map's queries."""
        for query in self.queries:
            query.stop()
        self._close()

    def _close(self) -> None:
        for projector in self.projectors:
            projector.close()

    def stop_fold(self, deadline: float) -> None:
        """Stop the fold once its batch in flight is done (cut short only at ``deadline``,
        a ``time.monotonic()``)."""
        _await_batch_end(self.fold, deadline)
        self.fold.stop()

    def drain(self, deadline: float) -> bool:
        """After ``stop_fold``: stop the side queries after their batch, then let the Delta
        table take in the changelog up to the fold's last batch. False when ``deadline`` cut
        that short (the next start merges the rest).

        A stop ends here, so the table a data team reads holds what Redis
        holds, whatever the Delta query's trigger interval.
        """
        for query in self.side:
            _await_batch_end(query, deadline)
            query.stop()
        done = True
        if self.catch_up is not None:
            query = self.catch_up()
            try:
                left = max(0, math.ceil(deadline - time.monotonic()))
                done = bool(query.awaitTermination(left))
            except Exception as exc:  # noqa: BLE001 - the next start replays it; say why
                log.error("map %s: the Delta table's last catch-up failed: %s", self.name, exc)
                done = False
            if query.isActive:
                query.stop()
        self._close()
        return done

    def stop_after_batch(self, timeout: float = FINISH_BATCH_TIMEOUT) -> None:
        """Stop each query once its batch in flight is done (cut short only after ``timeout``).

        A batch cut short is replayed by the next start and changes nothing
        twice, but letting it finish keeps that replay from happening at all.
        The timeout bounds the whole stop, so a pause is obeyed within it
        however many queries the map has.
        """
        deadline = time.monotonic() + timeout
        for query in self.queries:
            _await_batch_end(query, deadline)
            query.stop()
        self._close()


def _await_batch_end(query: StreamingQuery, deadline: float) -> None:
    """Return once the query's batch in flight (if any) has committed, or at ``deadline``.

    Under a steady stream batches run back to back and an idle trigger is
    rarely seen between them; a new progress report marks the end of the
    batch that was running, so the stop that follows cuts short at most the
    batch after it, which the next start replays.
    """
    started = _last_batch_id(query)
    while query.isActive and time.monotonic() < deadline:
        if not query.status["isTriggerActive"] or _last_batch_id(query) != started:
            return
        time.sleep(0.05)


def _last_batch_id(query: StreamingQuery) -> int | None:
    progress = query.lastProgress
    return None if progress is None else int(progress["batchId"])


def records(
    spark: SparkSession,
    config: AppConfig,
    map_name: str,
    until: dict[str, dict[int, int]] | None = None,
) -> DataFrame:
    """The map's records decoded and keyed, errors marked but not yet removed.

    With ``until`` (next offsets per topic and partition), only the records
    before it: a replay that must end exactly where another copy stands.
    """
    map_config = config.map(map_name)
    source = read_source(spark, config, map_config)
    if until is not None:
        source = source.where(before_offsets(until))
    with map_key_paths(map_name):
        decoded = decode(source, map_config)
        return assign_keys(apply_transforms(decoded, map_config.transforms), map_config)


def before_offsets(until: dict[str, dict[int, int]]) -> Column:
    """Records whose offset is below ``until`` for their partition; other partitions: none."""
    from pyspark.sql import functions as F

    condition = F.lit(False)
    for topic, partitions in until.items():
        for partition, offset in partitions.items():
            condition = condition | (
                (F.col(c.TOPIC) == topic)
                & (F.col(c.PARTITION) == partition)
                & (F.col(c.OFFSET) < offset)
            )
    return condition


@contextmanager
def map_key_paths(map_name: str) -> Iterator[None]:
    """Problems the stages find name keys within the map; the reader needs the whole path."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(exc.source, [f"maps.{map_name}.{p}" for p in exc.problems]) from None


def start_map(
    spark: SparkSession,
    config: AppConfig,
    map_name: str,
    batch_log: BatchLog | None = None,
    *,
    generation: int = 0,
    side_queries: bool = True,
    metrics: BatchMetrics | None = None,
    offsets_group: str | None = MAP_GROUP,
    until: dict[str, dict[int, int]] | None = None,
) -> MapQueries:
    """Start the fold query of one map and its side queries.

    ``generation`` picks the copy of the map's data the fold and Delta queries
    write (``materializer.contract.redis_layout.physical_name``): its Redis keys, table,
    changelog and checkpoints. Dead letters and history belong to the map
    itself, whatever the generation; ``side_queries=False`` leaves them out
    (a rebuild's replay must not send the map's dead letters twice).

    ``offsets_group`` is the consumer group each fold batch's end offsets are
    committed to, for Kafka's tools (``{map}``: the map's name); None commits
    none, for queries whose progress is not the map's (a rebuild's replay).
    ``until`` folds only the records before those offsets (``records``).
    """

    map_config = config.map(map_name)
    physical = physical_name(map_name, generation)
    keyed = records(spark, config, map_name, until)
    checkpoint = Checkpoint(spark, checkpoint_path(config, physical, "fold"))
    changelog = changelog_topic(config, map_name, generation)
    max_record_bytes = ensure_changelog_topic(config, map_name, changelog)
    letters = None
    if side_queries and map_config.on_error == "dead_letter":
        letters = dead_letter_topic(config, map_name)
        # One producer sends both: it takes the bigger of the two topics' records.
        limit = ensure_dead_letter_topic(config, map_name, letters)
        max_record_bytes = max(max_record_bytes, limit)
    ttl_ms = expiry_ms(map_config.ttl.redis if map_config.ttl else None)
    target = FoldTarget(
        redis=config.redis,
        map_name=physical,
        changelog_topic=changelog,
        producer=producer_settings(config.kafka, max_record_bytes),
        dead_letter_topic=letters,
        ttl_ms=ttl_ms,
        changes_max_len=map_config.changes.max_len,
        deleted_retention_ms=int(map_config.fold.deleted_retention.total_seconds() * 1000),
    )
    typer = None
    if is_inferred(map_config):
        typer = EntityTyper(table_path(config, physical), c.table_meta(map_config))
    one_partition_per_key = (
        map_config.key == KAFKA_KEY
        and len(map_config.source.topics) == 1
        and not any(t.type == "value_to_key" for t in map_config.transforms)
    )
    redis_fold = RedisFold(
        target,
        map_config.fold,
        fail_on_error=map_config.on_error == "fail",
        typer=typer,
        spread_keys=not one_partition_per_key,
    )
    with map_key_paths(map_name):
        events = redis_fold.events(observe_fold_input(keyed, dead_letters=letters is not None))
        entity = redis_fold.entity_type(keyed)
    load_library(config.redis)
    # A copy a server lost while the map was stopped is restored before anything folds.
    ensure_whole(config, map_name, generation)
    # The fold first (Redis, then the changelog), so lookups see a batch as soon as
    # possible; every step is idempotent per batch, so a crash between two is repaired by
    # the batch's replay. The watermark after the fold, the consumer group last: it
    # reports what the stores already hold.
    sinks: list[Sink] = [RedisFoldSink(redis_fold, checkpoint.end_offsets)]
    if side_queries and map_config.history:
        sinks.append(HistorySink(history_path(config, map_name)))
    sinks.append(
        RedisSink(config.redis, physical, checkpoint.end_offsets, map_config.changes.max_len)
    )
    if offsets_group is not None:
        group = offsets_group.replace("{map}", map_name)
        client = librdkafka(config.kafka)
        sinks.append(GroupOffsetsSink(group, checkpoint.end_offsets, client))
    rows_out = report_rows_out(batch_log, metrics)
    projector = Projector(
        physical,
        sinks,
        checkpoint,
        rows_out,
        keep_records=True,
        persist=map_config.history and side_queries,  # the history reads the batch too
    )
    fold_query = (
        events.writeStream.queryName(f"{physical}.fold")
        .option("checkpointLocation", checkpoint.location)
        .trigger(processingTime=config.spark.trigger_interval)
        .foreachBatch(projector)
        .start()
    )
    delta = _start_delta(spark, config, map_name, entity, rows_out, generation)
    return MapQueries(
        name=map_name,
        fold=fold_query,
        side=[delta],
        projectors=[projector],
        catch_up=functools.partial(
            _start_delta, spark, config, map_name, entity, rows_out, generation, catch_up=True
        ),
    )


def report_rows_out(
    *listeners: BatchLog | BatchMetrics | None,
) -> Callable[[str, int, int], None] | None:
    """The projector's one count of a batch's rows out, for the log line and the metrics."""
    targets = [listener.rows_out for listener in listeners if listener is not None]
    if not targets:
        return None

    def report(query: str, batch_id: int, count: int) -> None:
        for target in targets:
            target(query, batch_id, count)

    return report


def producer_options(config: AppConfig, max_record_bytes: int) -> dict[str, str]:
    """Spark ``kafka`` writer options (without the ``kafka.`` prefix) for a map's own topics."""
    return java(
        config.kafka,
        **{
            "enable.idempotence": "true",
            "acks": "all",
            "max.request.size": str(max_record_bytes),
        },
    )


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


def _start_delta(
    spark: SparkSession,
    config: AppConfig,
    map_name: str,
    entity: StructType,
    rows_out: Callable[[str, int, int], None] | None,
    generation: int,
    *,
    catch_up: bool = False,
) -> StreamingQuery:
    """The changelog into the Delta table: MERGE per batch, ``txnVersion`` = this query's batch.

    ``catch_up``: everything the changelog holds now, then the query ends (a stop's last).
    """
    from pyspark.sql import functions as F

    physical = physical_name(map_name, generation)
    map_config = config.map(map_name)
    inferred = is_inferred(map_config)
    # With ttl.delta each row keeps when the fold wrote its change: its record's Kafka timestamp.
    ttl = map_config.ttl if map_config.ttl and map_config.ttl.delta else None
    reader = spark.readStream.format("kafka")
    changelog = changelog_topic(config, map_name, generation)
    for key, value in kafka_options(config, [changelog], "earliest").items():
        reader = reader.option(key, value)
    raw = reader.load()
    changes = raw.select(
        raw["key"].cast("string").alias(c.KEY),
        raw["value"].isNull().alias(c.DELETED),
        changelog_entity(raw["value"].cast("string"), entity, inferred).alias(c.ENTITY),
        F.col("partition").alias(c.PARTITION),
        F.col("offset").alias(c.OFFSET),
        *([F.col("timestamp").alias(c.TIMESTAMP)] if ttl else []),
    )
    delta_checkpoint = checkpoint_path(config, physical, "delta")
    table = table_path(config, physical)
    sinks: list[Sink] = [DeltaSink(table, updated_at=ttl is not None)]
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
    projector = Projector(
        physical,
        sinks,
        Checkpoint(spark, delta_checkpoint),
        rows_out,
        query="delta",
        prepare=last_per_key,
        pool=DELTA_POOL,
    )
    writer = changes.writeStream.queryName(f"{physical}.delta").option(
        "checkpointLocation", delta_checkpoint
    )
    if catch_up:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=config.delta.trigger_interval)
    return writer.foreachBatch(
        typed_batches(projector, table, inferred, c.table_meta(map_config))
    ).start()
