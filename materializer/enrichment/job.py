"""The streaming query of one enrichment: events of its topics joined with maps, to Kafka.

Hazelcast Jet's ``mapUsingIMap`` plus a Kafka sink. One query per enrichment,
with its own checkpoint under ``<checkpoint_root>/<enrichment>/enrich``:

1. its topics are read and decoded: JSON without a schema goes to the join as
   the bytes it is; any other source is decoded and transformed like a map's,
   then re-encoded as JSON (a record that fails becomes a dead letter);
2. each micro-batch is joined on the executors (``partition_join``) with the
   maps' current generations, read from Redis in batches (``lookups_from:
   redis``) or taken from a join with each map's Delta table as it stands at
   the batch (``lookups_from: delta``, for backfills of a long history, where
   the tables hold what Redis would have to serve key by key);
3. the batch goes to the output and dead-letter topics (``outputs``), at least
   once or exactly once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.batch import Sink
from materializer.checkpoints.running import Checkpoint
from materializer.clients.kafka import librdkafka
from materializer.clients.redis import client_for, get_many
from materializer.config import KAFKA_KEY, AppConfig, EnrichmentConfig
from materializer.config.durations import processing_time
from materializer.config.names import MAP_GROUP, checkpoint_path, enrichment_dead_letter_topic
from materializer.contract.redis_layout import generation_key, parse_generation, physical_name
from materializer.contract.table_layout import table_meta, table_path
from materializer.encoding import entity_json
from materializer.enrichment.outputs import KafkaOutput, TransactionalOutput, producer_options
from materializer.enrichment.partition_join import (
    DEAD,
    EVENT,
    OUT,
    PartitionJoin,
    found_column,
    output_schema,
)
from materializer.enrichment.plan import JoinPlan, LookupStep, OnMiss, lookup_step, plan_rounds
from materializer.errors import ConfigError
from materializer.runtime.group_offsets import GroupOffsetsSink
from materializer.runtime.metrics import BatchMetrics
from materializer.runtime.progress import BatchLog
from materializer.runtime.projector import Projector, report_rows_out
from materializer.runtime.query_group import QueryGroup
from materializer.runtime.topics import ensure_topic
from materializer.source.decode import decode
from materializer.source.kafka import read_source
from materializer.source.transforms import apply_transforms

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

ENRICH_QUERY = "enrich"
MISS_RULES: dict[str, OnMiss] = {
    "null": "null",
    "omit": "omit",
    "drop": "null",
    "dead_letter": "error",
}
"""A lookup's ``on_miss`` as the join's rule: a dead letter is the join's error, a drop its
inner join."""


def join_plan(spec: EnrichmentConfig) -> JoinPlan:
    """The configured lookups as the join's plan (config validation already checked them)."""
    return plan_rounds(
        [
            lookup_step(
                map_name=lookup.map,
                key_field=lookup.key_field,
                alias=lookup.alias or "",
                fields=lookup.fields,
                inner=lookup.join == "inner" or lookup.on_miss == "drop",
                on_miss=MISS_RULES[lookup.on_miss],
            )
            for lookup in spec.lookups
        ]
    )


def events(spark: SparkSession, config: AppConfig, name: str) -> DataFrame:
    """The enrichment's records with their event as JSON bytes, or the error that stopped it."""
    from pyspark.sql import functions as F

    spec = config.enrichments[name]
    as_map = spec.as_map()
    raw = read_source(spark, config, as_map)
    source = spec.source
    if source.format == "json" and source.schema_ is None:
        records = raw.select(
            "*",
            F.col(c.VALUE).alias(EVENT),
            F.lit(None).cast("string").alias(c.ERROR_STAGE),
            F.lit(None).cast("string").alias(c.ERROR_MESSAGE),
        )
    else:
        try:
            decoded = apply_transforms(decode(raw, as_map), spec.transforms)
        except ConfigError as exc:
            problems = [f"enrichments.{name}.{p}" for p in exc.problems]
            raise ConfigError(exc.source, problems) from None
        fields = c.entity_fields(decoded.columns)
        document = entity_json(F.struct(*[F.col(c.quote(f)) for f in fields]))
        records = decoded.withColumn(
            EVENT, F.when(F.col(c.ERROR_STAGE).isNull(), document.cast("binary"))
        )
    return records.select(
        c.KAFKA_KEY,
        c.VALUE,
        c.HEADERS,
        c.TOPIC,
        c.PARTITION,
        c.OFFSET,
        EVENT,
        c.ERROR_STAGE,
        c.ERROR_MESSAGE,
    )


class BatchJoin:
    """The ``prepare`` step of the enrichment's projector: a batch of records joined."""

    def __init__(self, config: AppConfig, name: str) -> None:
        self.config = config
        self.name = name
        self.spec = config.enrichments[name]
        self.plan = join_plan(self.spec)
        self._redis = client_for(config.redis)
        out_key = self.spec.output.key
        self._output_key = None if out_key == KAFKA_KEY else tuple(out_key.split("."))

    def physical_names(self) -> dict[str, str]:
        """Each looked-up map's current generation, read once per batch: a rebuild's switch
        reaches the next batch."""
        maps = self.plan.maps
        raw = get_many(self._redis, [generation_key(m) for m in maps])
        return {m: physical_name(m, parse_generation(g)) for m, g in zip(maps, raw, strict=True)}

    def __call__(self, rows: DataFrame) -> DataFrame:
        """The batch's output rows (``partition_join.OUTPUT_ARROW``), lazily."""
        physical = self.physical_names()
        if self.spec.lookups_from == "redis":
            join = PartitionJoin(self.plan, physical, self.config.redis, self._output_key)
            return rows.mapInArrow(join, output_schema())
        for i, step in enumerate(self.plan.rounds[0]):
            rows = self._with_table(rows, i, step, physical[step.map])
        join = PartitionJoin(self.plan, physical, None, self._output_key)
        return rows.mapInArrow(join, output_schema())

    def _with_table(self, rows: DataFrame, i: int, step: LookupStep, physical: str) -> DataFrame:
        """``rows`` left-joined with the map's table on lookup ``i``'s key: its entity JSON."""
        from pyspark.sql import functions as F

        spark = rows.sparkSession
        key = F.get_json_object(F.col(EVENT).cast("string"), "$." + ".".join(step.key_path))
        meta = set(table_meta(self.config.map(step.map)))
        try:
            table = spark.read.format("delta").load(table_path(self.config, physical))
        except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException: no table yet
            log.warning(
                "enrichment %s: map %s has no table yet (%s): its lookups miss",
                self.name,
                step.map,
                exc,
            )
            return rows.withColumn(found_column(i), F.lit(None).cast("string"))
        fields = [f for f in table.columns if f not in meta]
        if step.fields:
            fields = [f for f in step.fields if f in fields]
        entities = table.select(
            F.col(c.TABLE_KEY).alias(f"__found_key_{i}"),
            entity_json(F.struct(*[F.col(c.quote(f)) for f in fields])).alias(found_column(i)),
        )
        joined = rows.join(entities, key == F.col(f"__found_key_{i}"), "left")
        return joined.drop(f"__found_key_{i}")


def start_enrichment(
    spark: SparkSession,
    config: AppConfig,
    name: str,
    batch_log: BatchLog | None = None,
    *,
    metrics: BatchMetrics | None = None,
) -> QueryGroup:
    """Start the enrichment's query; problems of its topics or config raise before it starts."""
    spec = config.enrichments[name]
    output = spec.output
    where = f"enrichments.{name}"
    topics = {
        OUT: output.topic,
        DEAD: enrichment_dead_letter_topic(config, name),
    }
    limits = [
        ensure_topic(config, spec.source.topics, topics[OUT], f"{where}.output.topic", {}),
        ensure_topic(config, spec.source.topics, topics[DEAD], f"{where}.dead_letter.topic", {}),
    ]
    location = checkpoint_path(config, name, ENRICH_QUERY)
    checkpoint = Checkpoint(spark, location)
    group = MAP_GROUP.replace("{map}", name)
    client = librdkafka(config.kafka)
    sinks: list[Sink]
    if output.guarantee == "exactly_once":
        producer = {
            "transactional.id": group,
            "transaction.timeout.ms": str(output.transaction_timeout_ms),
            "message.max.bytes": str(max(limits)),
        }
        sinks = [TransactionalOutput(topics, client, producer, group, checkpoint.end_offsets)]
    else:
        sinks = [
            KafkaOutput(topics, producer_options(config, max(limits))),
            GroupOffsetsSink(group, checkpoint.end_offsets, client),
        ]
    projector = Projector(
        name,
        sinks,
        checkpoint,
        report_rows_out(batch_log, metrics),
        query=ENRICH_QUERY,
        prepare=BatchJoin(config, name),
    )
    query = (
        events(spark, config, name)
        .writeStream.queryName(f"{name}.{ENRICH_QUERY}")
        .option("checkpointLocation", location)
        .trigger(processingTime=processing_time(config.spark.trigger_interval))
        .foreachBatch(projector)
        .start()
    )
    return QueryGroup(name=name, fold=query, projectors=[projector])
