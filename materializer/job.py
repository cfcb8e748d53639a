"""A map's streaming queries wired from source to sinks (``start_map``).

Each map runs two queries, each with its own checkpoint under
``<checkpoint_root>/<map>/``, so one map's failure leaves the others running:

- ``fold``: read and decode the map's topics once per micro-batch; send the
  records that cannot be folded to the dead-letter topic (``on_error:
  dead_letter``; ``skip`` drops them, ``fail`` fails the query at the first);
  fold the rest into Redis and write the changelog topic (``redis.sink``);
  append every folded event to ``<root>/<map>__events`` (``history: true``);
  commit the watermark (with the batch's table mark: where the changelog ended
  after it, ``redis.changelog_ends``), then the batch's end offsets to the consumer group
  ``materializer.<map>`` for Kafka's tools to see (the checkpoint, not the
  group, is where the fold resumes). Every step is idempotent per batch.
- ``delta``: the changelog into the Delta table, one MERGE per trigger of
  ``delta.trigger_interval`` (exactly once through Delta's transaction ids).
  Lookups see a batch as soon as Redis has it; the table follows within a
  trigger or so, without ever slowing the fold down (``delta.query``).

Each batch goes through a ``Projector`` (``runtime.projector``), and the two queries
run, stop and fail as one ``QueryGroup`` (``runtime.query_group``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.batch import Sink
from materializer.checkpoints.running import Checkpoint
from materializer.clients.kafka import librdkafka
from materializer.config import KAFKA_KEY, AppConfig, is_inferred
from materializer.config.durations import processing_time
from materializer.config.names import (
    MAP_GROUP,
    changelog_topic,
    checkpoint_path,
    dead_letter_topic,
)
from materializer.contract.redis_layout import physical_name
from materializer.contract.table_layout import history_path, table_meta, table_path
from materializer.delta.history import HistorySink
from materializer.delta.query import start_delta_query
from materializer.errors import ConfigError
from materializer.fold.entity_types import (
    EntityTyper,
)
from materializer.group.fencing import Ownership
from materializer.redis.apply import Applied
from materializer.redis.changelog_ends import ChangelogEnds
from materializer.redis.deliveries import producer_settings
from materializer.redis.expiry import expiry_ms
from materializer.redis.functions import FoldTarget, load_library
from materializer.redis.sink import RedisFold, RedisFoldSink
from materializer.redis.watermark import WatermarkSink
from materializer.restore.automatic import ensure_whole
from materializer.runtime.group_offsets import GroupOffsetsSink
from materializer.runtime.metrics import BatchMetrics
from materializer.runtime.pacing import CatchUpPace
from materializer.runtime.progress import BatchLog
from materializer.runtime.projector import CATCH_UP_POOL, FOLD_POOL, Projector, report_rows_out
from materializer.runtime.query_group import QueryGroup
from materializer.runtime.topics import ensure_changelog_topic, ensure_dead_letter_topic
from materializer.source.decode import decode
from materializer.source.kafka import FETCH_MAX_WAIT_MS, read_source
from materializer.source.keys import assign_keys
from materializer.source.transforms import apply_transforms

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

OPENING_RECORDS = 10_000
"""The most records a map's opening batch takes (``start_map``'s ``opening``): few enough
that a start over a long backlog shows its first entities within seconds, on the
driver's path (``redis.sink.DRIVER_ROWS``), before the Delta query competes for the cores
(docs/decisions/0025-a-map-opens-with-one-small-batch.md)."""
OPENING_TRIGGER = "1 day"


def records(
    spark: SparkSession,
    config: AppConfig,
    map_name: str,
    until: dict[str, dict[int, int]] | None = None,
    max_records: int | None = None,
    starting_offsets: str | None = None,
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
) -> DataFrame:
    """The map's records decoded and keyed, errors marked but not yet removed.

    With ``until`` (next offsets per topic and partition), only the records
    before it: a replay that must end exactly where another copy stands.
    ``max_records``: at most that many a batch, whatever ``spark.max_offsets_per_trigger``.
    ``starting_offsets``: where the query starts instead of ``source.starting_offsets``;
    ``fetch_max_wait_ms``: how long the broker may hold its readers' empty fetches.
    """
    map_config = config.map(map_name)
    source = read_source(
        spark, config, map_config, max_records, starting_offsets, fetch_max_wait_ms
    )
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


def map_fold(
    config: AppConfig,
    map_name: str,
    generation: int = 0,
    side_outputs: bool = True,
    owner: Ownership | None = None,
) -> RedisFold:
    """The map's fold into Redis and its changelog (and dead letters with ``side_outputs``),
    the topics made ready: what its fold query applies each batch with, on either path."""
    map_config = config.map(map_name)
    physical = physical_name(map_name, generation)
    changelog = changelog_topic(config, map_name, generation)
    max_record_bytes = ensure_changelog_topic(config, map_name, changelog)
    letters = None
    if side_outputs and map_config.on_error == "dead_letter":
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
        epoch=None if owner is None else owner.epoch,
        transactional_id=None if owner is None else owner.transactional_id,
    )
    typer = None
    if is_inferred(map_config):
        typer = EntityTyper(table_path(config, physical), table_meta(map_config))
    one_partition_per_key = (
        map_config.key == KAFKA_KEY
        and len(map_config.source.topics) == 1
        and not any(t.type == "value_to_key" for t in map_config.transforms)
    )
    return RedisFold(
        target,
        map_config.fold,
        fail_on_error=map_config.on_error == "fail",
        typer=typer,
        spread_keys=not one_partition_per_key,
    )


def start_map(
    spark: SparkSession,
    config: AppConfig,
    map_name: str,
    batch_log: BatchLog | None = None,
    *,
    generation: int = 0,
    side_outputs: bool = True,
    metrics: BatchMetrics | None = None,
    offsets_group: str | None = MAP_GROUP,
    until: dict[str, dict[int, int]] | None = None,
    owner: Ownership | None = None,
    opening: bool = False,
    pace: CatchUpPace | None = None,
    starting_offsets: str | None = None,
) -> QueryGroup:
    """Start the fold query of one map and its side queries.

    ``generation`` picks the copy of the map's data the fold and Delta queries
    write (``materializer.contract.redis_layout.physical_name``): its Redis keys, table,
    changelog and checkpoints. Dead letters and history belong to the map
    itself, whatever the generation; ``side_outputs=False`` leaves them out
    (a rebuild's replay must not send the map's dead letters twice).

    ``offsets_group`` is the consumer group each fold batch's end offsets are
    committed to, for Kafka's tools (``{map}``: the map's name); None commits
    none, for queries whose progress is not the map's (a rebuild's replay).
    ``until`` folds only the records before those offsets (``records``).
    ``owner``: in a worker group, the ownership its writes carry (``group.fencing``).
    ``opening``: only the fold, for one batch of at most ``OPENING_RECORDS`` records
    (``QueryGroup.opening``); its owner then starts the map's queries as usual.
    ``pace``: the map catches up beside live maps (``runtime.pacing``): at most
    ``catch_up.max_records_per_batch`` records a batch, in the catch-up pool, at that pace.
    ``starting_offsets``: the fold starts there, on a new checkpoint, where the real-time
    path left the map (``live.positions.handed_back``).
    """

    map_config = config.map(map_name)
    physical = physical_name(map_name, generation)
    max_records = OPENING_RECORDS if opening else None
    if pace is not None:
        max_records = map_config.catch_up.max_records_per_batch
    keyed = records(spark, config, map_name, until, max_records, starting_offsets)
    checkpoint = Checkpoint(spark, checkpoint_path(config, physical, "fold"))
    if starting_offsets is not None:
        checkpoint.discard()
    checkpoint.drop_unfinished_writes()
    redis_fold = map_fold(config, map_name, generation, side_outputs, owner)
    with map_key_paths(map_name):
        events = redis_fold.events(keyed)
        entity = redis_fold.entity_type(keyed)
    load_library(config.redis)
    # A copy a server lost while the map was stopped is restored before anything folds.
    ensure_whole(config, map_name, generation)
    # The fold first (Redis, then the changelog), so lookups see a batch as soon as
    # possible; every step is idempotent per batch, so a crash between two is repaired by
    # the batch's replay. The watermark after the fold, the consumer group last: it
    # reports what the stores already hold.
    fold_sink = RedisFoldSink(
        redis_fold,
        checkpoint.end_offsets,
        checkpoint.batch_time_ms,
        None if metrics is None else functools.partial(_report_applied, metrics, map_name),
        ChangelogEnds(config.kafka, redis_fold.target.changelog_topic),
    )
    sinks: list[Sink] = [fold_sink]
    if side_outputs and map_config.history:
        sinks.append(HistorySink(history_path(config, map_name)))
    sinks.append(
        WatermarkSink(
            config.redis,
            physical,
            checkpoint.end_offsets,
            map_config.changes.max_len,
            fold_sink.changelog_ends,
        )
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
        persist=map_config.history and side_outputs,  # the history reads the batch too
        pool=FOLD_POOL if pace is None else CATCH_UP_POOL,
        pace=pace,
    )
    # The opening's one batch, then nothing until its owner stops it between batches.
    trigger = OPENING_TRIGGER if opening else processing_time(config.spark.trigger_interval)
    fold_query = (
        events.writeStream.queryName(f"{physical}.fold")
        .option("checkpointLocation", checkpoint.location)
        .trigger(processingTime=trigger)
        .foreachBatch(projector)
        .start()
    )
    check = None if owner is None else owner.check
    side = []
    if not opening:
        side.append(
            start_delta_query(
                spark, config, map_name, entity, rows_out, generation, owner_check=check
            )
        )
    return MapQueries(
        name=map_name,
        fold=fold_query,
        side=side,
        projectors=[projector],
        redis_fold=redis_fold if side_outputs else None,
        entity=entity,
        opening=opening,
        catch_up=functools.partial(
            start_delta_query,
            spark,
            config,
            map_name,
            entity,
            rows_out,
            generation,
            catch_up=True,
            owner_check=check,
        ),
    )


@dataclass
class MapQueries(QueryGroup):
    """A map's queries as ``start_map`` started them, with what its fold applies records
    with."""

    redis_fold: RedisFold | None = None
    """The fold's Redis and Kafka side (``map_fold``), its topics made ready: the real-time
    path folds the map with it once the map joins (``run.live``)."""
    entity: StructType | None = None
    """The fold's entity struct: the real-time path's shared Delta query reads the map's
    changelog with it (``live.delta``)."""


def _report_applied(metrics: BatchMetrics, map_name: str, applied: Applied) -> None:
    metrics.fold_applied(
        map_name, applied.newest_timestamp_us, applied.dead_letters, applied.freshness
    )
