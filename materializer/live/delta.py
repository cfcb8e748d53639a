"""The Delta query the real-time path's maps share: their changelogs read by one micro-batch
query, each batch split by topic into each map's own Delta sinks (``delta.query``).

Each map's own Delta query plans, schedules and checkpoints a batch per trigger on the one
driver, and keeps its threads and a Kafka consumer while its map is idle: sixteen maps
were sixteen queries contending for the cores the real-time fold needs, a hundred idle
maps a hundred. One query costs one plan and one checkpoint per trigger, and a map
without changes in a batch costs nothing in it: the checkpoint's offset log says whose
changelogs moved. The rows of the maps that moved are collected to the driver in one job
(a Spark job's floor is a good part of a second of CPU here, whatever its size), which
each map's MERGE takes its part of in Arrow.

The query's checkpoint is new at every start (the set of maps changed): each map starts
where its table stands (``delta.positions.resume_at``), and every MERGE records the
changelog position it reached, which is what the next start, and the map's own Delta
query once it leaves the path, go on from. A map's failure (its MERGE failed, or another
worker owns it now) is its alone: the batch goes on for the others, the map's rows are
left to whichever writer its table has next, and the run takes the map off the path.

A stop (at every join and leave) lets the batch in flight finish its current map and
skips the rest: Spark cancels the jobs of a stopping query, which would read as those
maps' failures, and a map skipped records nothing, so the next start merges its rows.
A MERGE does not wait for the mark of the fold batch it merged (``delta.marks``): sixteen
maps would wait in turn, and the marks the run appends every second reach the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from materializer import record_columns as c
from materializer.batch import Sink
from materializer.checkpoints.files import CheckpointFiles
from materializer.checkpoints.running import Checkpoint
from materializer.clients.kafka_offsets import admin_client, partition_ids
from materializer.clients.object_store import delta_rs_location
from materializer.config import AppConfig, is_inferred
from materializer.config.durations import processing_time
from materializer.config.names import changelog_topic, checkpoint_path
from materializer.contract.redis_layout import physical_name
from materializer.contract.table_layout import table_meta, table_path
from materializer.delta.positions import MergedPositions, resume_at
from materializer.delta.query import (
    OwnerGuard,
    changelog_changes,
    changes_per_batch,
    delta_projector,
    delta_sinks,
    entities_collected,
    with_entity,
)
from materializer.fold.entity_types import Project, typed_batches
from materializer.runtime.projector import DELTA_POOL
from materializer.runtime.query_group import stop_after_batch

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

QUERY_NAME = "live-delta"
"""Without a dot: the run's metrics take it for no map's query (``split_query_name``)."""
READS_AT_ONCE = 8
"""Tables whose merged positions a start reads at once."""
TOGETHER_CELLS = 1_000_000
"""At most this many records times maps are collected in one job: each map's entity is a
column of its own, allocated for every record of the batch; a larger batch (a catch-up of
many maps) is collected map by map from the batch cached."""


@dataclass(frozen=True)
class DeltaMember:
    """A map whose table the shared query writes, as its Delta query would."""

    name: str
    generation: int
    config: AppConfig
    """The config the map runs on (a rebuild pins its old one)."""
    entity: StructType
    """The fold's entity struct, which the changelog's JSON is read with."""
    owner_check: Callable[[], None] | None = None
    """In a worker group: raises once another worker owns the map (``group.fencing``)."""


class _Member:
    """One map's part of each batch: its changelog's rows through its own projector."""

    def __init__(self, member: DeltaMember, checkpoint: Checkpoint, rows_out: RowsOut) -> None:
        self.name = member.name
        config = member.config
        physical = physical_name(member.name, member.generation)
        self.changelog = changelog_topic(config, member.name, member.generation)
        table = table_path(config, physical)
        self.merged = MergedPositions(delta_rs_location(config, table), self.changelog)
        self.own = CheckpointFiles(checkpoint_path(config, physical, "delta"), config.object_store)
        self.entity = member.entity
        self.inferred = is_inferred(config.map(member.name))
        self.with_time = bool((ttl := config.map(member.name).ttl) and ttl.delta)
        sinks: list[Sink] = [] if member.owner_check is None else [OwnerGuard(member.owner_check)]
        sinks += delta_sinks(config, member.name, physical, checkpoint, self.merged, mark_wait=0)
        self.projector = delta_projector(config, physical, sinks, checkpoint, rows_out)
        meta = table_meta(config.map(member.name))
        self.project: Project = typed_batches(self.projector, table, self.inferred, meta)
        self.in_arrow = not self.inferred and config.delta.merge_engine == "delta_rs"
        """Its MERGE reads the rows in Arrow: they can come from the batch's one collect."""


RowsOut = Callable[[str, int, int], None] | None


class SharedDelta:
    """The shared Delta query of one set of maps, from its start to its stop.

    ``failed(map, error)`` hears of a map's failure (once); its rows are not merged from
    then on. ``rows_out`` gets each map's rows out, as its own Delta query reports them.
    """

    def __init__(
        self,
        spark: SparkSession,
        config: AppConfig,
        members: Sequence[DeltaMember],
        checkpoint: str,
        failed: Callable[[str, str], None],
        rows_out: RowsOut = None,
    ) -> None:
        self._spark = spark
        self._config = config
        self._location = checkpoint
        self._checkpoint = Checkpoint(spark, checkpoint)
        self._members = [_Member(m, self._checkpoint, rows_out) for m in members]
        self._failed = failed
        self._broken: set[str] = set()
        self._stopping = threading.Event()
        self._starting: dict[str, dict[int, int]] = {}
        self.query: StreamingQuery | None = None

    def start(self) -> StreamingQuery:
        """Start the query on a new checkpoint, each changelog from where its table stands."""
        changelogs = [m.changelog for m in self._members]
        partitions = partition_ids(admin_client(self._config.kafka), changelogs)

        def start_of(m: _Member) -> dict[str, int]:
            where = resume_at(m.merged, m.own, partitions.get(m.changelog, []))
            return {str(p): o for p, o in where.items()}

        # Each reads its table's newest commits: a hundred maps' reads overlap.
        with ThreadPoolExecutor(max_workers=READS_AT_ONCE) as pool:
            starting = dict(zip(changelogs, pool.map(start_of, self._members), strict=True))
        self._starting = {t: {int(p): o for p, o in at.items()} for t, at in starting.items()}
        self._checkpoint.discard()
        changes = changelog_changes(
            self._spark,
            self._config,
            changelogs,
            orjson.dumps(starting).decode(),
            with_time=any(m.with_time for m in self._members),
        )
        interval = processing_time(self._config.delta.trigger_interval)
        self.query = (
            changes.writeStream.queryName(QUERY_NAME)
            .option("checkpointLocation", self._location)
            .trigger(processingTime=interval)
            .foreachBatch(self._batch)
            .start()
        )
        return self.query

    def _batch(self, changes: DataFrame, batch_id: int) -> None:
        """Each map whose changelog moved in the batch gets its rows through its projector,
        in turn; the rows of those that merge in Arrow are collected in one job for all,
        unless the batch is too large for that (``TOGETHER_CELLS``)."""
        started = time.monotonic()
        changes.sparkSession.sparkContext.setLocalProperty("spark.scheduler.pool", DELTA_POOL)
        moved = self._moved(batch_id)
        members = [m for m in self._members if m.changelog in moved and m.name not in self._broken]
        in_arrow = [m for m in members if m.in_arrow]
        records = min(sum(moved.values()), changes_per_batch(self._config))
        together = in_arrow if records * len(in_arrow) <= TOGETHER_CELLS else []
        jobs = len(members) - len(together) + (1 if together else 0)
        if jobs > 1:
            changes.persist()  # read from Kafka once, however many jobs read the batch
        try:
            if self._stopping.is_set():
                return  # the maps record nothing: the next start merges their rows
            entities = {m.changelog: m.entity for m in together}
            collected = self._collected(changes, entities)
            for member in members:
                if self._stopping.is_set():
                    return  # the maps left record nothing: the next start merges their rows
                rows = changes.where(changes[c.TOPIC] == member.changelog)
                rows = with_entity(rows, member.entity, member.inferred)
                try:
                    if member.changelog in collected:
                        member.projector(rows, batch_id, collected[member.changelog])
                    else:
                        member.project(rows, batch_id)
                except Exception as exc:  # noqa: BLE001 - the map's alone; the others go on
                    if self._stopping.is_set():
                        return  # cancelled by the stop, not the map's failure
                    self._broken.add(member.name)
                    self._failed(member.name, f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
        finally:
            if jobs > 1:
                changes.unpersist()
        log.debug(
            "query=%s batch=%d maps=%d projected_ms=%d",
            QUERY_NAME,
            batch_id,
            len(members),
            (time.monotonic() - started) * 1000,
        )

    def _collected(
        self, changes: DataFrame, entities: dict[str, StructType]
    ) -> dict[str, pa.Table]:
        """The maps' rows from one collect; none when it fails (Arrow or the driver refused
        it), so that each map collects its own and a failure is that map's alone."""
        try:
            return entities_collected(changes, entities)
        except Exception as exc:  # noqa: BLE001 - each map then fails or merges on its own
            if self._stopping.is_set():
                raise
            log.warning("%s: the batch's maps collect their rows one by one: %s", QUERY_NAME, exc)
            return {}

    def _moved(self, batch_id: int) -> dict[str, int]:
        """The changelogs whose offsets the batch moves, each with how many offsets (more than
        it has records where a start is the earliest, or the topic's log was compacted), from
        the checkpoint's offset log (a count would be a job): a map whose changelog stood
        still has nothing to merge. One that moved by transaction markers alone merges
        nothing and records its newer mark, as its own Delta query does."""
        ends = self._checkpoint.end_offsets(batch_id)
        before = self._checkpoint.end_offsets(batch_id - 1) if batch_id else self._starting
        moved = {}
        for topic, offsets in ends.items():
            start = before.get(topic, {})
            if offsets != start:  # a start at the earliest (negative) counts from offset 0
                spans = (end - max(start.get(p, 0), 0) for p, end in offsets.items())
                moved[topic] = sum(max(span, 0) for span in spans)
        return moved

    def changelogs(self) -> dict[str, str]:
        """Each member's changelog topic, by map."""
        return {m.name: m.changelog for m in self._members}

    def stop(self, deadline: float) -> None:
        """Stop the query once its batch in flight is done (its current map's, at
        ``deadline``), then release the sinks' clients and drop the checkpoint (a start
        never reads it)."""
        self._stopping.set()
        if self.query is not None:
            stop_after_batch(self.query, deadline)
        self._close()

    def _close(self) -> None:
        for member in self._members:
            member.projector.close()
        self._checkpoint.discard()
